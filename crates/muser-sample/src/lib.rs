//! Sampling: pure functions on a logits slice (greedy, temperature, top-k, top-p, min-p,
//! repetition penalty) chained in llama.cpp's default order, with a seeded MT19937.
