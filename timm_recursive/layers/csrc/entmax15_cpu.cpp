// entmax-1.5 over the last dim of a contiguous float32 CPU tensor, one row at a time.
//
// The Python solver makes ~15 passes over the whole (rows, n) tensor; here every row stays in
// L1 cache while its threshold is found, so the tensor is read once and written once, and the
// rows are spread over the intra-op threads. Same mathematics as entmax_ops.py:
//   z = (x - max x) / 2, p = [z - tau]_+^2 with sum p = 1, tau in [-1, 0).
// From tau = -1 (below the solution), repeat: on the support S = {z > tau}, solve
// sum_S (z - tau)^2 = 1 exactly (the smaller root of a quadratic); if every element of S lies
// above that root it is the solution, else take a Newton step on sum [z - tau]_+^2 - 1, which is
// convex and decreasing, so Newton from below stays below the solution and S only shrinks.
// Backward (closed form, g = sqrt(p)): dx = g dp - g sum(g dp) / sum(g).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <limits>

namespace {

constexpr int kMaxIterations = 100;  // about five in practice; a safety bound only

// Sums over the support S = {z > t}: its size, sum r and sum r^2 of r = z - t (Newton), sum z and
// sum z^2 (the exact root: z has max 0, so its variance does not cancel against a large mean the way
// r's would when t is far below the support), and the smallest z in S (as t + the smallest r, so that every select tests
// the same float and the loop vectorises). One SIMD loop with masked
// selects (supports are random: a branch per element would be mispredicted half the time).
struct SupportSums {
  double k, sr, srr, sz, szz;
  float smallest;
};

SupportSums support_sums(const float* z, int64_t n, float t) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  float k = 0.f, sr = 0.f, srr = 0.f, sz = 0.f, szz = 0.f, smallest = inf;
#pragma omp simd reduction(+ : k, sr, srr, sz, szz) reduction(min : smallest)
  for (int64_t i = 0; i < n; ++i) {
    const float d = z[i] - t;
    const float r = d > 0.f ? d : 0.f;
    const float zs = d > 0.f ? z[i] : 0.f;
    k += d > 0.f ? 1.f : 0.f;
    sr += r;
    srr += r * r;
    sz += zs;
    szz += zs * zs;
    smallest = std::min(smallest, d > 0.f ? d : inf);
  }
  return {k, sr, srr, sz, szz, smallest + t};
}

float row_threshold(const float* z, int64_t n) {
  float tau = -1.f;
  for (int it = 0; it < kMaxIterations; ++it) {
    const SupportSums s = support_sums(z, n, tau);
    // exact threshold on S: sum_S (z - root)^2 = 1, the smaller root
    const double mean = s.sz / s.k;
    const double var = std::max(s.szz / s.k - mean * mean, 0.0);
    const double root = mean - std::sqrt(std::max(1.0 / s.k - var, 0.0));
    if (static_cast<double>(s.smallest) > root) {  // every element of S stays above: the solution
      return static_cast<float>(root);
    }
    // Newton on f(tau) = sum r^2 - 1 with f' = -2 sum r, from below
    float next = tau + static_cast<float>((s.srr - 1.0) / (2.0 * s.sr));
    if (it == 0) {
      // From far below (tau = -1 on a near-uniform row) Newton only halves the distance per step. The root
      // lies above the solution (sum_S (z - t)^2 >= f + 1), and f is convex, so a Newton step from the root
      // lands below the solution too, and far nearer: near-uniform rows then take a few passes, not many.
      const float upper = static_cast<float>(root);
      const SupportSums a = support_sums(z, n, upper);
      next = std::max(next, upper + static_cast<float>((a.srr - 1.0) / (2.0 * a.sr)));
    }
    if (!(next > tau)) {  // no progress left in float: tau is the solution to rounding
      return tau;
    }
    tau = next;
  }
  return tau;
}

}  // namespace

torch::Tensor entmax15_forward(const torch::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32,
              "entmax15 CPU kernel: expected a float32 CPU tensor, got ", x.scalar_type(), " on ", x.device());
  const torch::Tensor input = x.contiguous();
  torch::Tensor out = torch::empty_like(input);
  const int64_t n = input.size(-1);
  const int64_t rows = n == 0 ? 0 : input.numel() / n;
  const float* in_ptr = input.data_ptr<float>();
  float* out_ptr = out.data_ptr<float>();
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = in_ptr + r * n;
      float* pr = out_ptr + r * n;
      float max = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : max)
      for (int64_t i = 0; i < n; ++i) max = std::max(max, xr[i]);
      for (int64_t i = 0; i < n; ++i) pr[i] = (xr[i] - max) * 0.5f;  // z, kept in the output row
      const float tau = row_threshold(pr, n);
      for (int64_t i = 0; i < n; ++i) {
        const float d = pr[i] - tau;
        pr[i] = d > 0.f ? d * d : 0.f;
      }
    }
  });
  return out;
}

torch::Tensor entmax15_backward(const torch::Tensor& p, const torch::Tensor& dp) {
  TORCH_CHECK(p.sizes() == dp.sizes(), "entmax15 CPU kernel: p and dp shapes differ");
  TORCH_CHECK(p.scalar_type() == torch::kFloat32 && dp.scalar_type() == torch::kFloat32,
              "entmax15 CPU kernel: expected float32 p and dp");
  const torch::Tensor pc = p.contiguous();
  const torch::Tensor dpc = dp.contiguous();
  torch::Tensor dx = torch::empty_like(pc);
  const int64_t n = pc.size(-1);
  const int64_t rows = n == 0 ? 0 : pc.numel() / n;
  const float* p_ptr = pc.data_ptr<float>();
  const float* dp_ptr = dpc.data_ptr<float>();
  float* dx_ptr = dx.data_ptr<float>();
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* pr = p_ptr + r * n;
      const float* dpr = dp_ptr + r * n;
      float* dxr = dx_ptr + r * n;
      float sum_g = 0.f, sum_gdp = 0.f;
#pragma omp simd reduction(+ : sum_g, sum_gdp)
      for (int64_t i = 0; i < n; ++i) {
        const float g = std::sqrt(pr[i]);
        sum_g += g;
        sum_gdp += g * dpr[i];
      }
      const float ratio = sum_gdp / sum_g;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) dxr[i] = std::sqrt(pr[i]) * (dpr[i] - ratio);
    }
  });
  return dx;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &entmax15_forward, "entmax-1.5 over the last dim (float32, CPU)");
  m.def("backward", &entmax15_backward, "closed-form entmax-1.5 backward over the last dim (float32, CPU)");
}
