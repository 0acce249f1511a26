// Autocast's state for one device type, read and set through one switch on
// the LibTorch version: 2.4 made the autocast calls take the device type and
// deprecated the CUDA-only ones (set_enabled, get_autocast_gpu_dtype) and
// the CPU-only ones (is_cpu_enabled, get_autocast_cpu_dtype) that 1.x has.
// Only CPU and CUDA are known here: other device types read as autocast off.
#pragma once

#include <ATen/autocast_mode.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <torch/version.h>

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define VQA_AUTOCAST_BY_DEVICE 1
#endif

namespace vqa::model {

// Whether bf16 autocast on the CPU can run this model: LibTorch 2.4 on.
// 1.13's cannot (its CPU LayerNorm refuses bfloat16 input with float32
// weights).
#ifdef VQA_AUTOCAST_BY_DEVICE
inline constexpr bool kCpuAutocastRunsTheModel = true;
#else
inline constexpr bool kCpuAutocastRunsTheModel = false;
#endif

// Whether autocast is on for `device` (CPU or CUDA).
inline bool autocast_enabled(c10::DeviceType device) {
#ifdef VQA_AUTOCAST_BY_DEVICE
  if (device != c10::DeviceType::CPU && device != c10::DeviceType::CUDA) return false;
  return at::autocast::is_autocast_enabled(device);
#else
  if (device == c10::DeviceType::CUDA) return at::autocast::is_enabled();
  if (device == c10::DeviceType::CPU) return at::autocast::is_cpu_enabled();
  return false;
#endif
}

// The dtype autocast casts to on `device` (CPU or CUDA), whether on or not.
inline c10::ScalarType autocast_dtype(c10::DeviceType device) {
#ifdef VQA_AUTOCAST_BY_DEVICE
  return at::autocast::get_autocast_dtype(device);
#else
  return device == c10::DeviceType::CUDA ? at::autocast::get_autocast_gpu_dtype()
                                         : at::autocast::get_autocast_cpu_dtype();
#endif
}

// Turns autocast on for `device` (CPU or CUDA), casting to `dtype`.
inline void autocast_enable(c10::DeviceType device, c10::ScalarType dtype) {
#ifdef VQA_AUTOCAST_BY_DEVICE
  at::autocast::set_autocast_dtype(device, dtype);
  at::autocast::set_autocast_enabled(device, true);
#else
  if (device == c10::DeviceType::CUDA) {
    at::autocast::set_autocast_gpu_dtype(dtype);
    at::autocast::set_enabled(true);
  } else {
    at::autocast::set_autocast_cpu_dtype(dtype);
    at::autocast::set_cpu_enabled(true);
  }
#endif
}

// Turns autocast off for `device` (CPU or CUDA); its dtype stays as it was.
inline void autocast_disable(c10::DeviceType device) {
#ifdef VQA_AUTOCAST_BY_DEVICE
  at::autocast::set_autocast_enabled(device, false);
#else
  if (device == c10::DeviceType::CUDA) {
    at::autocast::set_enabled(false);
  } else {
    at::autocast::set_cpu_enabled(false);
  }
#endif
}

}  // namespace vqa::model
