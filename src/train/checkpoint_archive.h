// Reading a LibTorch archive (a checkpoint, best_model.pt, a checkpoint's
// optimiser part) that may come from elsewhere.
//
// A LibTorch archive is a zip holding, besides the tensors and two pickles,
// TorchScript source for the class of every module in it
// (code/__torch__/___torch_mangle_N.py), and LibTorch compiles that source
// while it loads. Its TorchScript parser is not written for hostile input:
// one renamed word in a class (`__parameters__` to `__7arameters__`) sends
// LibTorch 1.13 into a recursion that ends in a segmentation fault, before
// any check of ours could run (fuzz_checkpoint found it). The CRC sidecar
// catches a file damaged after it was written, not a file handed over with a
// matching sidecar or none.
//
// So the source is checked first, against the little that vqa-hpc's archives
// hold: each class file is `class Module(Module):` followed by its parameter
// and buffer lists and one typed attribute a line, the types one of Tensor,
// int, float, bool, str, a Tuple or List of those, or another class file of
// the archive, and the classes refer to each other without a cycle. Anything
// else in code/ (other than each class file's debug record) is refused
// before LibTorch parses a byte of it.
#pragma once

#include <torch/torch.h>

#include <string>

namespace vqa::train {

// Empty when the archive's zip and TorchScript source have the shape
// described above; otherwise what is wrong, completing "checkpoint PATH ...",
// e.g. "has TorchScript source vqa-hpc does not write: code/__torch__.py line
// 2: ...".
std::string torch_archive_problem(const std::string& bytes);

// Checks `bytes` (torch_archive_problem), then parses them into `archive`
// with every tensor on `device`, through reads bounded by `bytes` (LibTorch's
// in-memory reader copies from any offset its zip reader asks for: a
// fuzzed archive made it read outside the buffer). Throws std::runtime_error starting
// "checkpoint PATH " on a refusal or any error of LibTorch's.
void torch_archive_load(const std::string& path, const std::string& bytes,
                        const torch::Device& device, torch::serialize::InputArchive& archive);

}  // namespace vqa::train
