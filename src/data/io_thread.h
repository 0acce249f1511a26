// The process's one HDF5 thread. This HDF5 build is not thread-safe, so every
// HDF5 call of the loaders (open, validate, read, close) runs here, in
// submission order. Internal to src/data.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>

namespace vqa::data {

class Hdf5IoThread {
 public:
  // Started on first use; joined at process exit.
  static Hdf5IoThread& instance();

  // Runs `task` on the I/O thread; the future carries its result or exception.
  // Any thread may submit.
  template <typename Function>
  auto submit(Function task) -> std::future<decltype(task())> {
    using Result = decltype(task());
    auto packaged = std::make_shared<std::packaged_task<Result()>>(std::move(task));
    std::future<Result> result = packaged->get_future();
    enqueue([packaged] { (*packaged)(); });
    return result;
  }

  // For a caller that gave up waiting on a task stuck inside HDF5 (a damaged
  // file can make HDF5 1.10 loop forever): the thread cannot be stopped, so
  // the destructor leaves it running instead of joining it, and the process
  // should end soon (the job does, through fatal_user_error).
  void abandon();

  ~Hdf5IoThread();

 private:
  Hdf5IoThread();
  void enqueue(std::function<void()> work);
  void run();

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false, abandoned_ = false;
  std::thread thread_;
};

}  // namespace vqa::data
