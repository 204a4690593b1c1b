#pragma once
// gear's distributed buffer: one logical buffer sharded across processes and machines, over
// libfabric (link gear::libfabric; Debian: libfabric-dev). For GPU storage include
// <gear/gear.cuh> first (compiled by nvcc).
//
//   using shard_t  = gear::replay_buffer<Spec, Storage, Selection, gear::transport::libfabric>;
//   using client_t = gear::replay_buffer<Spec, gear::storage::none, Selection,
//                                        gear::transport::libfabric>;
//
// A shard holds real storage, is a local buffer in every respect (insert, writers, sample,
// update_priorities, erase, from any thread) and serves it to remote actors and learners while
// it lives (transport/shard_buffer.hpp). Its address() blob is what clients need; hand it over by
// any channel (a file, a job launcher, the TCP rendezvous in examples/distributed).
//
// A client (storage::none) stores nothing: insert and make_writer go to the shards as the
// transport routes them; sample splits the batch across the shards by their selection masses,
// each shard selecting and gathering its share, with probabilities and importance weights over
// the union; update_priorities and erase go to the shard each key names
// (transport/client_buffer.hpp).
//
//   gear::transport::libfabric t;       // provider "tcp;ofi_rxm"; "shm" on one host
//   t.shard = 3; t.token = secret;      // a shard
//   shard_t shard(gear::capacity{1 << 20}, gear::max_length{64}, gear::select::uniform{}, t);
//   publish(shard.address());
//
//   gear::transport::libfabric c;       // a learner, or an actor
//   c.shards = gather_blobs(); c.token = secret;
//   client_t client(c);
//   client.insert(trajectories, keys);  // or client.make_writer()
//   client.sample(batch, window, g);
//
// Keys name their shard and its incarnation (a random number drawn when the shard starts): a key
// from before a shard restarted is stale there, never another trajectory.

#include <gear/gear.hpp>
#include <gear/storage/none.hpp>
#include <gear/transport/client_buffer.hpp>
#include <gear/transport/libfabric.hpp>
#include <gear/transport/shard_buffer.hpp>
