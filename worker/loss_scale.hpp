// Dynamic loss scaling for fp16 training, as torch.cuda.amp.GradScaler does it: the loss is
// multiplied by `scale` so small gradients survive fp16; a step whose unscaled gradients hold an
// inf or NaN is skipped and the scale halved; after `growth_interval` clean steps in a row the
// scale doubles. Free of LibTorch so it is unit-tested in the main test binary.
#pragma once

namespace gpuq::worker {

class LossScale {
 public:
  explicit LossScale(double init = 65536.0, int growth_interval = 2000) : m_scale(init), m_interval(growth_interval) {}

  double scale() const { return m_scale; }
  int clean_steps() const { return m_clean; }
  // As a checkpoint saved it (a step-level resume continues the same sequence of scales).
  void restore(double scale, int clean_steps) {
    m_scale = scale;
    m_clean = clean_steps;
  }

  // Records a step's outcome; returns whether the optimiser step may be applied.
  bool update(bool found_inf) {
    if (found_inf) {
      m_scale *= k_backoff;
      m_clean = 0;
      return false;
    }
    if (++m_clean == m_interval) {
      m_scale *= k_growth;
      m_clean = 0;
    }
    return true;
  }

 private:
  static constexpr double k_growth = 2.0;
  static constexpr double k_backoff = 0.5;
  double m_scale;
  int m_interval;
  int m_clean = 0;  // clean steps since the last change
};

}  // namespace gpuq::worker
