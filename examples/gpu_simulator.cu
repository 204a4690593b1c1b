// gear example: a GPU simulator writes trajectories straight into the buffer, an actor on the CPU
// writes step by step, and a learner samples both.
//
//   1. buf.reserve(n, stream)            hands out n slots (evicting the oldest when full)
//   2. a kernel writes steps through buf.ref(gear::op::write_steps{})  (a trivially copyable view),
//      enqueued on the same stream after reserve (reserve is stream-ordered and does not wait)
//   3. buf.commit(reservation, lengths, keys, stream)  makes them visible to sampling
//
// Storage is mixed: the large observation column lives in pinned host memory (capacity bounded by
// RAM, gathered zero-copy), the small ones on the device, in memory taken from a CUDA memory pool
// the program owns (gear/memory_resource.hpp). Needs a GPU; exits 77 without one.

#include <cstdio>
#include <gear/gear.cuh>
#include <vector>

using spec = gear::spec<gear::column<"obs", float, 64>,  // 256 B per step
                        gear::column<"reward", float>, gear::column<"done", bool>>;
using storage = gear::storage::mixed<gear::storage::pinned_host,  // obs
                                     gear::storage::device,       // reward
                                     gear::storage::device>;      // done
using buffer = gear::replay_buffer<spec, storage, gear::select::uniform, gear::transport::local>;

// Device memory from a cudaMemPool_t, handed to the buffer as its device slots. A resource is any
// object with allocate(bytes, alignment) and deallocate(p, bytes, alignment); gear checks that
// what it gets is device memory of its GPU, aligned to 256 bytes (a fresh pool's first block is).
class pool_resource {
 public:
  explicit pool_resource(int device) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    GEAR_CUDA_TRY(cudaMemPoolCreate(&pool_, &props));
    GEAR_CUDA_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~pool_resource() {
    (void)cudaStreamDestroy(stream_);
    (void)cudaMemPoolDestroy(pool_);
  }
  pool_resource(const pool_resource&) = delete;
  pool_resource& operator=(const pool_resource&) = delete;

  void* allocate(std::size_t bytes, std::size_t /*alignment*/) {
    void* p = nullptr;
    GEAR_CUDA_TRY(cudaMallocFromPoolAsync(&p, bytes, pool_, stream_));
    const cudaError_t ready = cudaStreamSynchronize(stream_);  // usable from every stream now
    if (ready != cudaSuccess) (void)cudaFreeAsync(p, stream_);
    GEAR_CUDA_TRY(ready);
    ++blocks;
    return p;
  }
  void deallocate(void* p, std::size_t, std::size_t) {  // gear has waited for its work
    (void)cudaFreeAsync(p, stream_);
    (void)cudaStreamSynchronize(stream_);
  }
  int blocks = 0;

 private:
  cudaMemPool_t pool_{};
  cudaStream_t stream_{};
};

// One block per environment; threads step through time. A real simulator would run physics here.
template <class Ref>
__global__ void simulate(Ref ref, gear::reservation envs, std::int64_t steps) {
  const std::int64_t env = blockIdx.x;
  const std::int64_t slot = envs.slot(env);
  for (std::int64_t t = threadIdx.x; t < steps; t += blockDim.x) {
    float* obs = ref.template step<0>(slot, t);
    for (int i = 0; i < 64; ++i) obs[i] = static_cast<float>(env) + 0.001f * static_cast<float>(t);
    *ref.template step<1>(slot, t) = t == steps - 1 ? 1.0f : 0.0f;
    *ref.template step<2>(slot, t) = t == steps - 1;
  }
}

int main() {
  if (!gear::detail::gpu_available()) {
    std::printf("gpu_simulator: needs a GPU; none found, skipping\n");
    return 77;
  }
  try {
    cudaStream_t stream{};
    GEAR_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    int device = 0;
    GEAR_CUDA_TRY(cudaGetDevice(&device));
    pool_resource pool(device);  // outlives the buffer
    buffer buf{gear::capacity{4096}, gear::max_length{200}, {}, {}, {.device = pool}};
    std::printf("buffer built: its device slots are %d block(s) of the program's memory pool\n",
                pool.blocks);

    // GPU producer: 1024 environments, 200 steps each, written in place.
    const std::int64_t envs = 1024, steps = 200;
    const gear::reservation r = buf.reserve(envs, stream);
    simulate<<<static_cast<unsigned>(envs), 128, 0, stream>>>(buf.ref(gear::op::write_steps{}), r,
                                                              steps);
    GEAR_CHECK_LAUNCH("simulate");
    std::vector<std::int64_t> lengths(envs, steps);
    std::vector<gear::key> keys(envs);
    buf.commit(r, lengths, keys, stream);
    std::printf("simulator committed %lld trajectories of %lld steps\n",
                static_cast<long long>(envs), static_cast<long long>(steps));

    // CPU actor: one step at a time, then an explicit commit.
    auto writer = buf.make_writer(stream);
    std::vector<float> obs(64, -1.0f);
    for (int t = 0; t < 50; ++t) {
      const float reward = 0.1f * static_cast<float>(t);
      const bool done = t == 49;
      writer.append(obs.data(), &reward, &done);
    }
    const gear::key actor_key = writer.commit();
    std::printf("actor committed ticket %llu in slot %lld (50 steps); %lld trajectories stored\n",
                static_cast<unsigned long long>(actor_key.ticket),
                static_cast<long long>(actor_key.slot(buf.capacity())),
                static_cast<long long>(buf.size()));

    // Learner: windows of 32 random steps.
    auto batch = buf.make_batch(gear::batch_size{512}, gear::window_length{32});
    gear::rng rng{1};
    buf.sample(batch, gear::window{.length = 32, .from = gear::anchor::random}, rng, stream);
    std::vector<float> first_obs(512);
    GEAR_CUDA_TRY(cudaMemcpy2D(first_obs.data(), sizeof(float), batch.column<"obs">().data_handle(),
                               32 * 64 * sizeof(float), sizeof(float), 512,
                               cudaMemcpyDeviceToHost));
    std::vector<gear::key> sampled(512);
    GEAR_CUDA_TRY(cudaMemcpy(sampled.data(), batch.keys().data(), 512 * sizeof(gear::key),
                             cudaMemcpyDeviceToHost));
    int wrong = 0;
    for (int row = 0; row < 512; ++row) {
      const gear::key k = sampled[row];
      // The simulator's trajectories hold tickets r.first_ticket + env.
      const float env = k == actor_key ? -1.0f : static_cast<float>(k.ticket - r.first_ticket);
      wrong += static_cast<int>(first_obs[row]) != static_cast<int>(env);
    }
    std::printf("learner sampled 512 x 32 windows; %d rows disagree with their trajectory\n",
                wrong);
    GEAR_CUDA_TRY(cudaStreamDestroy(stream));
    return wrong == 0 ? 0 : 1;
  } catch (const gear::error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
