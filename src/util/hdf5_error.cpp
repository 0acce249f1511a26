#include "util/hdf5_error.h"

#include <hdf5.h>

#include <vector>

namespace vqa::util {

namespace {
herr_t collect_frame(unsigned /*depth*/, const H5E_error2_t* error, void* out) {
  static_cast<std::vector<std::string>*>(out)->push_back(
      std::string(error->func_name ? error->func_name : "?") + ": " +
      (error->desc ? error->desc : "?"));
  return 0;
}
}  // namespace

std::string hdf5_error_stack() {
  std::vector<std::string> frames;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_frame, &frames);
  if (frames.empty()) return "no HDF5 error on the stack";
  std::string text;
  for (size_t i = 0; i < frames.size(); ++i) {
    if (i == 3 && frames.size() > 5) {
      text += " <- ...";
      i = frames.size() - 2;
    }
    text += (text.empty() ? "" : " <- ") + frames[i];
  }
  return text;
}

}  // namespace vqa::util
