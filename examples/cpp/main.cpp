// A LibTorch program that functionalizes a function mutating its input through a view, then
// checks the result and the input against running the same function eagerly. Exit code 0 means
// they match.
#include <torch/torch.h>
#include <torch_functionalize/functionalize.h>

#include <iostream>

namespace {

// Writes the diagonal of x through a view, and returns a sum that reads the written values.
std::vector<at::Tensor> step(const std::vector<at::Tensor>& in) {
  const at::Tensor& x = in[0];
  x.diagonal().mul_(2);
  at::Tensor y = x.t().clone();
  y.add_(1);
  return {y.sum(1)};
}

}  // namespace

int main() {
  const at::Tensor start = torch::arange(9, torch::kFloat).reshape({3, 3});
  at::Tensor eager_x = start.clone();
  at::Tensor func_x = start.clone();

  const auto expected = step({eager_x});
  const auto got = tfz::functionalize(step, tfz::Remove::MutationsAndViews)({func_x});

  const bool ok = torch::equal(got[0], expected[0]) && torch::equal(func_x, eager_x);
  std::cout << "functionalized output: " << got[0] << "\ninput after the call:\n"
            << func_x << "\nmatches eager: " << (ok ? "yes" : "NO") << std::endl;
  return ok ? 0 : 1;
}
