// A second translation unit of the gpu suite that includes <gear/gear.cuh> and instantiates the
// same kernels as gpu_tests.cu: proves that gear's headers can be used from several translation
// units of one program without duplicate symbols.

#include <gear/gear.cuh>

#include "common.hpp"

namespace gear_test {

std::int64_t sample_in_second_unit(cuda::stream_ref stream) {
  gear::replay_buffer<spec, gear::storage::device> buf{gear::capacity{4}, gear::max_length{2}};
  packed p(1, {2, 1});
  std::vector<gear::key> keys(2);
  buf.insert(p.input(), keys, stream);
  auto out = buf.make_batch(gear::batch_size{8}, gear::window_length{2});
  gear::rng g{1};
  buf.sample(out, gear::window{2}, g, stream);
  return buf.size();
}

}  // namespace gear_test
