//! The article's own sentences. Every claim the report files as the article's quotes one of
//! these — as written (Chinese), translated, and with the section it is in — so that the ledger
//! never attributes the lab's statements to the article. Sections follow the article's own
//! numbering: §3.1 why divide by √d_k (with its two tables), §3.2 why softmax, §3.3 masks, §4 the
//! implementation, §5 autoregressive masks, §6 the hands-on experiments, Q1–Q4 the self-test
//! questions.

use serde::Serialize;

/// One sentence of the article that the lab checks.
#[derive(Debug, PartialEq, Eq, Serialize)]
pub struct Quote {
    /// Where it is.
    pub section: &'static str,
    /// The sentence as the article writes it.
    pub zh: &'static str,
    /// A translation.
    pub en: &'static str,
}

/// §3.1: the std of q·k is √d_k.
pub const DOT_STD_IS_SQRT_D: Quote = Quote {
    section: "§3.1",
    zh: "所以 std[q·k] = √d_k。",
    en: "so std[q·k] = √d_k.",
};

/// §3.1: after dividing by √d the std is about 1.
pub const SCALED_STD_NEAR_ONE: Quote = Quote {
    section: "§3.1",
    zh: "完美吻合：点积的 std 就是 √d，除以 √d 后稳定在 1 附近。",
    en: "a perfect match: the std of the dot product is √d, and after dividing by √d it stays near 1.",
};

/// §3.1: the softmax saturation table.
pub const SATURATION_TABLE: Quote = Quote {
    section: "§3.1 (softmax saturation table)",
    zh: "实测输出：元素数 / logits_std / 最大概率 / 熵 / 均匀分布熵（12 行）",
    en: "measured output: elements / logits_std / max probability / entropy / uniform entropy (12 rows)",
};

/// §3.1: larger logits push softmax toward one-hot.
pub const LARGE_LOGITS_ONE_HOT: Quote = Quote {
    section: "§3.1",
    zh: "仔细看 logits_std = 16 那一行：熵只有 0.105 ~ 0.326 … 注意力分布几乎变成了 one-hot",
    en: "look at the logits_std = 16 rows: the entropy is only 0.105–0.326 … the attention distribution has almost become one-hot",
};

/// §3.1: unscaled logits at d_k = 64 are clearly saturated.
pub const DK64_CLEARLY_SATURATED: Quote = Quote {
    section: "§3.1",
    zh: "d_k = 64 时，点积 std 是 8 … 不缩放就是 logits_std=8，已经落在表里 std=4 和 std=16 之间，softmax 明显饱和。",
    en: "at d_k = 64 the dot-product std is 8 … unscaled means logits_std = 8, already between the table's std = 4 and std = 16: softmax is clearly saturated.",
};

/// §3.1 and Q1: saturated softmax makes the gradient vanish.
pub const GRADIENT_VANISHES: Quote = Quote {
    section: "§3.1, Q1",
    zh: "梯度消失：softmax 饱和区域的导数 softmax(z)(1-softmax(z)) 趋近 0",
    en: "vanishing gradients: in the saturated region the derivative softmax(z)(1 − softmax(z)) tends to 0",
};

/// Q1: at d_k = 1024 the gradient is almost zero.
pub const GRADIENT_ALMOST_ZERO: Quote = Quote {
    section: "Q1",
    zh: "d_k = 1024 时 max_p = 0.9999，softmax 数值上就是 one-hot，梯度几乎为 0。",
    en: "at d_k = 1024, max_p = 0.9999: numerically softmax is one-hot and the gradient is almost 0.",
};

/// §6 experiment 1: unscaled attention degenerates into one-hot.
pub const UNSCALED_ONE_HOT: Quote = Quote {
    section: "§6 experiment 1",
    zh: "不缩放时 max_p 全部=0.9999，注意力完全退化成 one-hot",
    en: "unscaled, max_p is 0.9999 everywhere: attention fully degenerates into one-hot",
};

/// §6 experiment 1: scaled max p is 0.02–0.035.
pub const SCALED_MAX_P: Quote = Quote {
    section: "§6 experiment 1",
    zh: "缩放后 max_p 回到 0.02~0.035，有明确的相对差异可供学习",
    en: "scaled, max_p comes back to 0.02–0.035, with clear relative differences to learn from",
};

/// Q1: the table at d_k = 64.
pub const DK64_TABLE: Quote = Quote {
    section: "Q1",
    zh: "不缩放 0.9990 注意力完全塌成one-hot；缩放 0.0350 有区分度，可以学习（d_k = 64）",
    en: "unscaled 0.9990, attention fully collapsed into one-hot; scaled 0.0350, discriminative, can learn (d_k = 64)",
};

/// §6 experiment 1: the premise of the analysis.
pub const PREMISE_STD_ONE: Quote = Quote {
    section: "§6 experiment 1",
    zh: "经过层归一化和训练后，实际进入 attention 的 q, k 分量 std 接近 1，所以上面的分析成立。",
    en: "after layer normalization and training, the q, k components that actually enter attention have std close to 1, so the analysis above holds.",
};

/// §6 experiment 1: right after projection the components are small.
pub const PROJECTED_STD_SMALL: Quote = Quote {
    section: "§6 experiment 1",
    zh: "真实 Transformer 里 q, k 经过 W_Q, W_K 投影后分量 std 约 1/√d_in 量级",
    en: "in a real Transformer, after the W_Q, W_K projections the components of q, k have std of the order of 1/√d_in",
};

/// Q1: without scaling training fails completely …
pub const TRAINING_FAILS: Quote = Quote {
    section: "Q1",
    zh: "现象：softmax 饱和 → 梯度消失 → 训练完全失效或极慢。（训练完全失效）",
    en: "what happens: softmax saturates → gradients vanish → training fails completely or is extremely slow. (the 'fails completely' half)",
};

/// Q1: … or is extremely slow.
pub const TRAINING_EXTREMELY_SLOW: Quote = Quote {
    section: "Q1",
    zh: "现象：softmax 饱和 → 梯度消失 → 训练完全失效或极慢。（极慢）",
    en: "what happens: softmax saturates → gradients vanish → training fails completely or is extremely slow. (the 'extremely slow' half)",
};

/// Q1: the whole sentence: fails completely or is extremely slow.
pub const TRAINING_SENTENCE: Quote = Quote {
    section: "Q1",
    zh: "现象：softmax 饱和 → 梯度消失 → 训练完全失效或极慢。",
    en: "what happens: softmax saturates → gradients vanish → training fails completely or is extremely slow.",
};

/// §3.2: softmax weights sum to 1, nothing is amplified without bound.
pub const SOFTMAX_BUDGET: Quote = Quote {
    section: "§3.2",
    zh: "softmax 让权重和为 1，等于「分配注意力预算」——每个 token 分配的注意力总量固定，不会因为某个分数高就无限放大。",
    en: "softmax makes the weights sum to 1, an 'attention budget': the total attention of each token is fixed, and nothing is amplified without bound because one score is high.",
};

/// §3.2: raw dot products as weights lose control of the output's scale.
pub const RAW_WEIGHTS_UNCONTROLLED: Quote = Quote {
    section: "§3.2",
    zh: "如果直接用点积，权重可能全都很小（输出尺度失控）或都很大（输出爆炸）。",
    en: "with the dot products used directly, the weights may all be very small (the output's scale is out of control) or all very large (the output explodes).",
};

/// §3.3: −∞ in PyTorch is safe (for the causal mask it builds).
pub const MINUS_INF_SAFE: Quote = Quote {
    section: "§3.3",
    zh: "实践中 PyTorch 用 float('-inf') 是安全的，因为 softmax 内部对 -inf 有特殊处理。",
    en: "in practice PyTorch's float('-inf') is safe, because softmax handles −inf specially.",
};

/// Q3: a −10⁹ fill works.
pub const MINUS_1E9_WORKS: Quote = Quote {
    section: "Q3",
    zh: "softmax([5.0, -1e9]) = [1.0, 0.0]   ✓ 效果正确",
    en: "softmax([5.0, −1e9]) = [1.0, 0.0] ✓ works correctly",
};

/// Q3: −10⁹ does not fit in fp16.
pub const MINUS_1E9_FP16: Quote = Quote {
    section: "Q3",
    zh: "如果模型内部用 fp16，−10⁹ 直接超出 fp16 范围（最大 65504），会变成 -inf 或 nan。",
    en: "if the model runs in fp16, −10⁹ is outside fp16's range (max 65504) and becomes −inf or nan.",
};

/// Q3: −10⁹ is at the edge in fp32.
pub const MINUS_1E9_FP32_EDGE: Quote = Quote {
    section: "Q3",
    zh: "用 fp32 的话 −10⁹ 也在边缘。",
    en: "in fp32, −10⁹ is also at the edge.",
};

/// Q3: two masks added overflow further.
pub const TWO_MASKS_OVERFLOW: Quote = Quote {
    section: "Q3",
    zh: "如果同时有 padding mask，两层 mask 相加可能得到 −2×10⁹，进一步溢出。",
    en: "with a padding mask as well, the two masks added may give −2×10⁹, overflowing further.",
};

/// §6 experiment 2: the hand-written attention equals PyTorch's.
pub const IMPLEMENTATIONS_AGREE: Quote = Quote {
    section: "§6 experiment 2",
    zh: "手写 vs PyTorch 内置 … → 完全一致，但内置版本内存效率高得多",
    en: "hand-written vs PyTorch's built-in … → identical, but the built-in is much more memory-efficient",
};

/// §6 experiment 2: the causal mask keeps earlier outputs unchanged.
pub const CAUSAL_PAST_UNCHANGED: Quote = Quote {
    section: "§6 experiment 2",
    zh: "前面的 token 输出完全不受影响，causal mask 正确",
    en: "the outputs of the earlier tokens are completely unaffected: the causal mask is correct",
};

/// §6 experiment 3: copies point at their twins.
pub const COPIES_POINT_AT_TWINS: Quote = Quote {
    section: "§6 experiment 3",
    zh: "第 4~7 行（副本）应该主要指向对应的 0~3 列，因为它们内容相同，q·k 最大。",
    en: "rows 4–7 (the copies) should point mainly at the matching columns 0–3, because their content is the same and q·k is largest.",
};

/// Q4: time is quadratic in the sequence length.
pub const TIME_QUADRATIC: Quote = Quote {
    section: "Q4",
    zh: "时间复杂度：O(n·m·d_k)，当 n = m = L 时是 O(L² d_k)。",
    en: "time complexity O(n·m·d_k), i.e. O(L²·d_k) for n = m = L.",
};

/// Q4: memory is quadratic.
pub const MEMORY_QUADRATIC: Quote = Quote {
    section: "Q4",
    zh: "空间复杂度：注意力矩阵本身要存 O(L²)。这是平方级。",
    en: "space complexity: the attention matrix itself takes O(L²). Quadratic.",
};

/// Q4: LLaMA-7B per layer.
pub const LLAMA_PER_LAYER: Quote = Quote {
    section: "Q4",
    zh: "注意力矩阵：2 × 32 × 4096 × 4096 × 2 = 2.1 GB ← 单层！",
    en: "attention matrices: 2 × 32 × 4096 × 4096 × 2 = 2.1 GB ← one layer!",
};

/// Q4: LLaMA-7B over 32 layers.
pub const LLAMA_ALL_LAYERS: Quote = Quote {
    section: "Q4",
    zh: "32 层累计就是 68 GB 仅用于存注意力矩阵。",
    en: "32 layers add up to 68 GB just for the attention matrices.",
};

/// Q4: FlashAttention does not store the matrix.
pub const FLASH_NO_MATRIX: Quote = Quote {
    section: "Q4",
    zh: "FlashAttention：不显式存注意力矩阵",
    en: "FlashAttention: never stores the attention matrix explicitly",
};
