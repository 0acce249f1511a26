#include "data/io_thread.h"

namespace vqa::data {

Hdf5IoThread& Hdf5IoThread::instance() {
  static Hdf5IoThread thread;
  return thread;
}

Hdf5IoThread::Hdf5IoThread() : thread_([this] { run(); }) {}

Hdf5IoThread::~Hdf5IoThread() {
  bool abandoned = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    abandoned = abandoned_;
  }
  wake_.notify_one();
  if (abandoned) {
    thread_.detach();
  } else {
    thread_.join();
  }
}

void Hdf5IoThread::abandon() {
  std::lock_guard<std::mutex> lock(mutex_);
  abandoned_ = true;
}

void Hdf5IoThread::enqueue(std::function<void()> work) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(work));
  }
  wake_.notify_one();
}

void Hdf5IoThread::run() {
  for (;;) {
    std::function<void()> work;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left to run
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    work();  // a packaged_task: exceptions land in its future
  }
}

}  // namespace vqa::data
