//! The arithmetic the CPU references share with each other and with the
//! Vulkan kernels' CPU references (`vulkan::qops`): RMSNorm, the dot product
//! in eight lanes, and the log-softmax the scoring uses. Defined to the bit:
//! the same result for any thread count.

/// `-ln softmax(logits)[target]`, in f64.
pub fn neg_log_softmax(logits: &[f32], target: usize) -> f64 {
    let max = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let lse = logits
        .iter()
        .map(|&l| (l as f64 - max).exp())
        .sum::<f64>()
        .ln()
        + max;
    lse - logits[target] as f64
}

/// `out = (x * (1 / sqrt(mean(x²) + eps))) * w`, the mean of squares summed
/// in f64; all `[dim]`.
pub fn rmsnorm(out: &mut [f32], x: &[f32], w: &[f32], eps: f32) {
    let ss = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / ((ss as f32) + eps).sqrt();
    for ((o, &xi), &wi) in out.iter_mut().zip(x).zip(w) {
        *o = (xi * inv) * wi;
    }
}

/// Dot product in 8 lanes (vectorizes), then the lanes halved in a tree.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}
