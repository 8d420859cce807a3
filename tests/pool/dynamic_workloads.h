// Seeded synthetic dynamic-shape workloads for the pool: allocation streams whose tensor sizes
// change from one iteration (or request) to the next, as a replay's testing::TraceEvent list.
// Sizes are fractions of a scale, so one shape runs as a small program (a peak of a few hundred
// MB, where the 2 MiB granule is a visible share) or a large one (several GB).
//
// Deterministic: a fixed-algorithm generator (SplitMix64) and integer maths only, so a seed gives
// the same events on every platform and standard library.
// Thread safety: none needed (plain functions).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "pool_test_support.h"

namespace vramscope::pool::testing {

class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}
  std::uint64_t Next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [lo, hi] (the modulo bias is irrelevant here).
  std::uint64_t Uniform(std::uint64_t lo, std::uint64_t hi) { return lo + Next() % (hi - lo + 1); }

 private:
  std::uint64_t state_;
};

// Builds the event list; keys are unique per allocation.
class WorkloadBuilder {
 public:
  std::uint64_t Alloc(std::uint64_t bytes) {
    // PyTorch rounds requests to 512 B; so do the traces.
    bytes = std::max<std::uint64_t>(512, (bytes + 511) / 512 * 512);
    const std::uint64_t key = ++next_key_;
    events_.push_back({true, key, bytes});
    return key;
  }
  void Free(std::uint64_t key) { events_.push_back({false, key, 0}); }
  std::vector<TraceEvent> Take() { return std::move(events_); }

 private:
  std::uint64_t next_key_ = 0;
  std::vector<TraceEvent> events_;
};

// Small tensors a framework allocates around every large one (biases, norms' statistics, scalars,
// index tensors): 512 B .. 64 KiB.
inline void SmallTensors(SplitMix64& rng, WorkloadBuilder& w, std::vector<std::uint64_t>* keep,
                         int count) {
  for (int i = 0; i < count; ++i) {
    const std::uint64_t key = w.Alloc(rng.Uniform(1, 128) * 512);
    if (keep != nullptr && rng.Uniform(0, 1) == 0) {
      keep->push_back(key);
    } else {
      w.Free(key);
    }
  }
}

// The shape of a training program.
struct TrainingShape {
  int min_layers = 24;  // the layer count is drawn from [min_layers, max_layers]
  int max_layers = 40;
  bool workspace = true;   // a temporary per layer in the forward pass, freed after it
  bool keep_small = true;  // half of the small tensors live until the backward pass
  int steps = 30;
};
// A deep network: many layers, workspaces, small tensors kept across the step.
inline constexpr TrainingShape kDeepTraining{};
// A few wide layers, like traces/mlp_dynamic_train: every tensor a large share of the pool.
inline constexpr TrainingShape kMlpTraining{3, 6, false, false, 30};

// Training with a batch size drawn per step (1 .. 1024): weights and optimizer state allocated
// once; each step a forward pass keeps an activation per layer (proportional to the batch) and a
// few small tensors, a backward pass frees them in reverse while the weights' gradients (fixed
// sizes) build up, and an optimizer step with per-layer temporaries frees the gradients.
// `scale`: the weights' bytes; the peak is about 3-4x that.
inline std::vector<TraceEvent> DynamicTraining(std::uint64_t seed, std::uint64_t scale,
                                               const TrainingShape& shape = kDeepTraining) {
  SplitMix64 rng(seed);
  WorkloadBuilder w;
  const int layers = static_cast<int>(rng.Uniform(static_cast<std::uint64_t>(shape.min_layers),
                                                  static_cast<std::uint64_t>(shape.max_layers)));
  const std::uint64_t per_layer = scale / static_cast<std::uint64_t>(layers);
  std::vector<std::uint64_t> weight(static_cast<std::size_t>(layers));
  std::vector<std::uint64_t> width(static_cast<std::size_t>(layers));  // at the largest batch
  for (std::size_t i = 0; i < weight.size(); ++i) {
    weight[i] = per_layer * rng.Uniform(50, 150) / 100;
    width[i] = per_layer * rng.Uniform(20, 150) / 100;
    w.Alloc(weight[i]);                 // the weight
    w.Alloc(weight[i]);                 // optimizer state
    w.Alloc(rng.Uniform(1, 16) * 512);  // its bias
  }
  for (int step = 0; step < shape.steps; ++step) {
    const std::uint64_t batch = rng.Uniform(1, 1024);
    std::vector<std::uint64_t> acts;
    std::vector<std::vector<std::uint64_t>> small(weight.size());
    for (std::size_t i = 0; i < weight.size(); ++i) {
      std::uint64_t tmp = 0;
      if (shape.workspace) tmp = w.Alloc(width[i] * batch / 1024 / 2 + rng.Uniform(0, 4096));
      acts.push_back(w.Alloc(width[i] * batch / 1024));
      SmallTensors(rng, w, shape.keep_small ? &small[i] : nullptr, 4);
      if (shape.workspace) w.Free(tmp);
    }
    std::vector<std::uint64_t> grads;
    for (std::size_t i = weight.size(); i-- > 0;) {
      const std::uint64_t grad_in = w.Alloc(width[i] * batch / 1024);
      grads.push_back(w.Alloc(weight[i]));
      SmallTensors(rng, w, shape.keep_small ? &grads : nullptr, 2);
      w.Free(acts[i]);
      for (const std::uint64_t key : small[i]) w.Free(key);
      w.Free(grad_in);
    }
    SmallTensors(rng, w, nullptr, 16);
    for (std::size_t i = 0; i < weight.size(); ++i) {
      const std::uint64_t tmp = w.Alloc(weight[i]);
      w.Free(tmp);
    }
    for (const std::uint64_t key : grads) w.Free(key);
  }
  return w.Take();
}

// Inference with continuous batching over requests of random lengths: weights allocated once; up
// to 8 requests in flight, each growing a KV cache that is reallocated larger (allocate the new
// size, free the old) when it is full, per-step activations sized by the tokens in flight and
// small per-step tensors, and a request's cache freed when it ends. Lifetimes interleave, so the
// free space fragments. `scale`: the weights' bytes; the caches of 8 long requests are about as
// large.
inline std::vector<TraceEvent> DynamicInference(std::uint64_t seed, std::uint64_t scale,
                                                int steps = 400) {
  SplitMix64 rng(seed);
  WorkloadBuilder w;
  const int layers = static_cast<int>(rng.Uniform(16, 32));
  for (int i = 0; i < layers; ++i) w.Alloc(scale / static_cast<std::uint64_t>(layers));
  const std::uint64_t max_tokens = 2048;
  const std::uint64_t kv_per_token = scale / 8 / max_tokens;  // bytes, all layers together
  struct Request {
    std::uint64_t length = 0;  // tokens so far
    std::uint64_t target = 0;
    std::uint64_t kv = 0;  // key of the cache tensor, 0 before the first
    std::uint64_t kv_tokens = 0;
  };
  std::vector<Request> active;
  for (int step = 0; step < steps; ++step) {
    if (active.size() < 8 && rng.Uniform(0, 3) != 0) {
      Request r;
      r.length = rng.Uniform(16, max_tokens / 2);  // the prompt
      r.target = std::min<std::uint64_t>(max_tokens, r.length + rng.Uniform(1, max_tokens / 2));
      active.push_back(r);
    }
    std::uint64_t tokens = 0;
    for (Request& r : active) tokens += r.length;
    std::vector<std::uint64_t> step_small;
    const std::uint64_t act = w.Alloc(kv_per_token * tokens / 16 + rng.Uniform(0, 65536));
    SmallTensors(rng, w, &step_small, 6);
    for (Request& r : active) {
      r.length += rng.Uniform(8, 32);
      if (r.kv == 0 || r.length > r.kv_tokens) {
        // Grow the cache with 25% room, as a framework's concatenation buffers do.
        r.kv_tokens = std::min<std::uint64_t>(max_tokens, r.length + r.length / 4);
        const std::uint64_t bigger = w.Alloc(kv_per_token * r.kv_tokens);
        if (r.kv != 0) w.Free(r.kv);
        r.kv = bigger;
      }
    }
    w.Free(act);
    for (const std::uint64_t key : step_small) w.Free(key);
    for (std::size_t i = 0; i < active.size();) {
      if (active[i].length >= active[i].target) {
        w.Free(active[i].kv);
        active[i] = active.back();
        active.pop_back();
      } else {
        ++i;
      }
    }
  }
  return w.Take();
}

}  // namespace vramscope::pool::testing
