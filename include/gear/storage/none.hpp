#pragma once
// gear::storage::none: a buffer that stores nothing itself. Only a distributed buffer takes it
// (replay_buffer<Spec, storage::none, Selection, transport::libfabric>, <gear/distributed.hpp>):
// a pure actor or learner, whose inserts and samples go to the shards that do store.

namespace gear::storage {

struct none {};

}  // namespace gear::storage
