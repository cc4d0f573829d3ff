// A LibTorch model out of the process: its step is captured functionalized in C++ and saved
// (`aoti_example save model.tfz`), compiled by AOTInductor from Python
// (`python -m torch_functionalize.package model.tfz model.pt2`), then loaded and run from C++
// (`aoti_example run model.pt2`) and checked against the same step run eagerly: the output and
// the KV cache it writes. Exit code 0 means they match.
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/torch.h>
#include <torch_functionalize/functionalize.h>
#include <torch_functionalize/serialize.h>

#include <iostream>
#include <string>
#include <vector>

namespace {

// The model: a projection whose result is written into its slot of a KV cache, then a read of
// the cache. The weights are the same in both runs of the program (seeded).
struct Step {
  mutable torch::nn::Linear proj{nullptr};  // forward() is non-const in LibTorch
  Step() {
    torch::manual_seed(0);
    proj = torch::nn::Linear(4, 4);
  }
  std::vector<at::Tensor> operator()(const std::vector<at::Tensor>& in) const {
    const at::Tensor& cache = in[0];
    const at::Tensor& pos = in[1];
    const at::Tensor& x = in[2];
    cache.index_copy_(1, pos, proj->forward(x));
    return {cache.sum(1)};
  }
};

std::vector<at::Tensor> inputs(int64_t pos, int64_t seed) {
  torch::manual_seed(seed);
  return {torch::zeros({2, 8, 4}), torch::tensor({pos}), torch::randn({2, 1, 4})};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || (std::string(argv[1]) != "save" && std::string(argv[1]) != "run")) {
    std::cerr << "usage: aoti_example save GRAPH | aoti_example run PACKAGE.pt2\n";
    return 2;
  }
  torch::NoGradGuard no_grad;
  const Step step;
  if (std::string(argv[1]) == "save") {
    const auto graph = tfz::capture(step, inputs(3, 1));
    tfz::save(graph, argv[2]);
    std::cout << "captured " << graph.num_nodes() << " ops, saved to " << argv[2] << std::endl;
    return 0;
  }
  // Another position and other values than the capture's: the package is specialized to shapes.
  auto eager_in = inputs(5, 2);
  auto aoti_in = inputs(5, 2);
  const auto expected = step(eager_in);
  torch::inductor::AOTIModelPackageLoader loader(argv[2]);
  const auto got = loader.run(aoti_in);
  const bool ok = got.size() == 1 && torch::allclose(got[0], expected[0]) &&
                  torch::allclose(aoti_in[0], eager_in[0]);
  std::cout << "AOTInductor package output:\n"
            << got[0] << "\nmatches eager (output and written cache): " << (ok ? "yes" : "NO")
            << std::endl;
  return ok ? 0 : 1;
}
