// A 0-dim device tensor's truth value, read by the host later without
// stalling the device: capture() queues a copy into pinned host memory and
// records an event behind it on the current stream; take() waits for that
// event only (by then, normally a step later, long passed) and returns the
// value. On the CPU the value is there at once.
#pragma once

#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/torch.h>

#include <chrono>
#include <optional>
#include <thread>

namespace vqa::train {

class DeferredFlag {
 public:
  void capture(const torch::Tensor& flag) {
    const auto value = flag.detach().to(torch::kBool).reshape({});
    if (!value.is_cuda()) {
      host_ = value.clone();
      event_.reset();
    } else {
      if (!host_.defined() || !host_.is_pinned()) {
        host_ = torch::empty({}, torch::TensorOptions().dtype(torch::kBool).pinned_memory(true));
      }
      host_.copy_(value, /*non_blocking=*/true);
      event_.emplace(c10::DeviceType::CUDA);
      event_->record(
          c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(value.device()));
    }
    pending_ = true;
  }
  bool pending() const { return pending_; }
  // The captured value; waits for its copy if it is still on the way.
  bool take() {
    if (event_) {
      while (!event_->query()) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    pending_ = false;
    return host_.item<bool>();
  }

 private:
  torch::Tensor host_;
  std::optional<c10::Event> event_;
  bool pending_ = false;
};

}  // namespace vqa::train
