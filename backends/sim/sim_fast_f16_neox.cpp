// The sim's dtype-specialised fast_v4 instantiations with f16 q and neox rope (one
// quarter of them; sim_grid.h sim_launch_fast_part). Empty where the sim runs the generic one only.
#include "backends/sim/sim_grid.h"

#if ROPEKV_SIM_SPECIALISED
namespace ropekv {
namespace sim_detail {
template void sim_launch_fast_part<ropekv_gpu::rk_f16, 1>(const ropekv_gpu::rk_launch&, const sim_config&);
}  // namespace sim_detail
}  // namespace ropekv
#endif
