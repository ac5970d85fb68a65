/* Broken plugins for the bad-input tests, in C99 (this also proves include/ropekv/plugin.h is
 * plain C). One source, one flavour per define:
 *   PLUGIN_NO_RUN:       does not export ropekv_plugin_run (not a complete plugin)
 *   PLUGIN_ABI=N:        reports ABI version N
 *   PLUGIN_RUN_ERROR:    supports everything, run returns ROPEKV_PLUGIN_ERROR with a message
 *   PLUGIN_SAYS_NO:      supports nothing ("not supported: this test plugin runs nothing")
 *   PLUGIN_GPU:          wants GPU memory; supports a case only when every tensor says
 *                        ROPEKV_DEVICE_GPU; run returns ROPEKV_PLUGIN_ERROR saying what it got
 *                        (the device kinds and the stream), so a test sees how it was called
 */
#include <stdio.h>

#include "ropekv/plugin.h"

#ifndef PLUGIN_ABI
#define PLUGIN_ABI ROPEKV_PLUGIN_ABI_VERSION
#endif

ROPEKV_PLUGIN_EXPORT int ropekv_plugin_abi_version(void) { return PLUGIN_ABI; }

#ifdef PLUGIN_GPU
ROPEKV_PLUGIN_EXPORT int ropekv_plugin_device(void) { return ROPEKV_DEVICE_GPU; }
#endif

ROPEKV_PLUGIN_EXPORT int ropekv_plugin_supports(const ropekv_plugin_args* args, char* why, size_t why_size) {
  (void)args;
#if defined(PLUGIN_GPU)
  if (args->q_out.device != ROPEKV_DEVICE_GPU || args->kv_c.device != ROPEKV_DEVICE_GPU) {
    snprintf(why, why_size, "not supported: a tensor not in GPU memory");
    return 0;
  }
  return 1;
#elif defined(PLUGIN_SAYS_NO)
  snprintf(why, why_size, "not supported: this test plugin runs nothing");
  return 0;
#else
  (void)why;
  (void)why_size;
  return 1;
#endif
}

#ifndef PLUGIN_NO_RUN
ROPEKV_PLUGIN_EXPORT int ropekv_plugin_run(const ropekv_plugin_args* args, void* stream, char* msg, size_t msg_size) {
#ifdef PLUGIN_GPU
  snprintf(msg, msg_size, "run saw q_out.device=%d kv_c.device=%d stream=%p", (int)args->q_out.device,
           (int)args->kv_c.device, stream);
  return ROPEKV_PLUGIN_ERROR;
#endif
  (void)stream;
  snprintf(msg, msg_size, "workspace of %lld tokens exhausted", (long long)args->q_out.sizes[0]);
  return ROPEKV_PLUGIN_ERROR;
}
#endif
