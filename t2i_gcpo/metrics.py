"""Names of every logged metric, each with its formula. metrics.jsonl, TensorBoard and the run
report all use these keys (one place, so the docs and the code cannot drift)."""

from __future__ import annotations

from typing_extensions import TypedDict


class MetricsRow(TypedDict):
    """One line of metrics.jsonl as its readers check it (outdir.read_jsonl): the step, then metric name →
    number (null where it was NaN)."""

    __pydantic_config__ = {"extra": "allow"}  # type: ignore[misc]
    step: int


STEP = "step"  # optimizer steps completed
REWARD_MEAN = "reward/mean"  # mean r_i over the samples of the step (before dynamic sampling)
REWARD_STD = "reward/std"  # std r_i over the same samples
# a weighted sum r = Σ_k w_k r_k: each term's mean r_k over the step's samples (its name in the sum, e.g.
# reward/pickscore/mean), and under advantage.reward_norm=per_reward (GDPO) the mean over the same samples of
# |w_k A_k|, A_k the term's own group-normalised advantage (its share of the advantage before the batch
# normalisation; core/advantages.decoupled_advantages)
REWARD_TERM = "reward/{name}/mean"
ADVANTAGE_TERM = "advantage/{name}/mean_abs"
STRICT = "strict/overall"  # mean strict GenEval correctness of the step's samples (reward details)
STRICT_TAG = "strict/{tag}"  # same, per GenEval tag
# mean partial-credit score (docs/evaluation/geneval.md#geneval-as-a-reward), where the reward reports it
PARTIAL = "partial/mean"
ZERO_STD_RATIO = "zero_std_ratio"  # fraction of sampled groups whose rewards were all equal (DAPO)
GROUPS_KEPT = "groups_kept"  # groups with signal that were trained on this step
GROUPS_DRAWN = "groups_drawn"  # groups sampled this step, over all dynamic-sampling rounds
GROUPS_CARRIED = "groups_carried"  # groups with signal left over from the previous step, trained now
LOSS_POLICY = "loss/policy"  # aggregated clipped surrogate −min(ρÂ, clip(ρ)Â)
LOSS_KL = "loss/kl"  # β × aggregated k3 KL (0 without a reference)
KL_K3 = "kl_k3"  # mean over valid tokens of exp(q) − q − 1, q = log π_ref − log π_θ
CLIP_FRAC = "clip_frac"  # fraction of valid tokens whose ratio was clipped (zero gradient)
RATIO_MEAN = "ratio/mean"  # mean ρ over valid tokens
# the sampler's recorded log-probs against the update's first-pass forward of the same weights (the
# step's fresh rows; context = the trained one, pos or guided):
MISMATCH_K3 = "mismatch/k3_{context}"  # mean over valid tokens of exp(q) − q − 1, q = log π_rollout − log π_θ
MISMATCH_MAX = "mismatch/max_abs_{context}"  # max over those tokens of |log π_θ − log π_rollout|
TIS_WEIGHT_MEAN = "tis/weight_mean"  # mean over valid tokens of min(π_old/π_rollout, C) (loss.tis_cap = C)
TIS_CAPPED = "tis/capped_frac"  # fraction of valid tokens whose weight π_old/π_rollout exceeded C
ENTROPY = "entropy"  # mean token entropy of the trained distribution, nats
GRAD_NORM = "grad_norm"  # global gradient norm before clipping
LR = "lr"  # learning rate of the step's update (optim.lr_scheduler)
CREDIT_WEIGHT_MAX = "credit/weight_max"  # mean over sequences of max_t w_t
CREDIT_WEIGHT_ENTROPY = "credit/weight_entropy"  # mean over sequences of H(w/N) / ln N (1 = uniform)
CREDIT_LIFT = "credit_lift"  # (share of credit on object tokens) / (share of object tokens); 1 = uniform
TIME_ROLLOUT = "time/rollout"  # seconds spent sampling (all dynamic-sampling rounds)
# CUDA-graph captures of the decode step that failed during the step's rollouts (each then sampled uncaptured,
# the same samples; policies/decode_loop.py); logged where the rollouts capture (rollout.decode graph/compile)
DECODE_FALLBACK = "rollout/decode_fallback"
TIME_REWARD = "time/reward"  # seconds spent decoding and scoring
TIME_UPDATE = "time/update"  # seconds spent in credit, loss, backward and optimizer
TIME_STEP = "time/step"  # wall time of the whole step
# what a step spent (summed over processes; branch continuations included), and the run's totals so far
BUDGET_SAMPLES = "budget/samples"  # samples sampled and scored: the groups' and any continuations
BUDGET_TOKENS = "budget/tokens"  # tokens sampled (valid tokens; a continuation's from its branch point on)
BUDGET_REWARD_CALLS = "budget/reward_calls"  # calls of the reward (each scores one batch of samples)
# budget allocation (rollout.allocation): samples left in the groups the step may train
# on, after down-sampling
BUDGET_KEPT = "budget/samples_kept"
# intermediate predictions x̂_s decoded and scored (stepwise credit: S − 1 per trained sample; sampled nothing)
BUDGET_STEP_PREDICTIONS = "budget/step_predictions"
BUDGET_TOTAL = "{key}_total"  # e.g. budget/samples_total: the sum over the run's steps
BUDGET = (BUDGET_SAMPLES, BUDGET_TOKENS, BUDGET_REWARD_CALLS, BUDGET_STEP_PREDICTIONS)
EVAL_STRICT = "eval/strict/overall"  # held-out strict score (unweighted mean of the tag scores)
EVAL_STRICT_TAG = "eval/strict/{tag}"
EVAL_PARTIAL = "eval/partial/mean"
# standard error of eval/strict/overall over the sampled images: √(Σ_t p_t(1 − p_t)/n_t) / T over its T tags
# (stats.proportions_se); the report draws eval/strict/overall ± 1.96 of it
EVAL_STRICT_SE = "eval/strict_se"
# the paired change of the held-out score from step 0 (eval/records/paired.py): the held-out evaluation draws
# the same samples' noise for the same prompts at every step (prompt i's generator seeded by (seed, "eval",
# i)), so each item i — a prompt and sample index — pairs with itself at step 0: d_i = score_i(step) −
# score_i(0). Per category c (a GenEval tag; "all" for tasks without tags): mean_i∈c d_i, its Student-t 95 %
# interval's half-width; overall: as the headline aggregates (GenEval tasks: (1/C) Σ_c mean_c d, variance
# (1/C²) Σ_c s²_c/n_c, Welch–Satterthwaite dof; other tasks: the mean of d over every item), and the
# half-width of the unpaired interval of the same change (both steps' items taken as independent)
EVAL_CHANGE = "eval/change/{category}"
EVAL_CHANGE_CI = "eval/change_ci/{category}"
EVAL_CHANGE_UNPAIRED_CI = "eval/change_unpaired_ci/overall"
# free-text prompts scored by the reward alone (task prompts)
EVAL_REWARD = "eval/reward/mean"  # held-out mean reward over every sample
EVAL_REWARD_SE = "eval/reward_se"  # its standard error over the prompts' mean rewards
# a benchmark suite as the held-out evaluation (eval_suite, train/eval_suite.py): the suite's overall score as
# its paper aggregates it (GenEval 2: the mean image Soft-TIFA GM; WISE: 0.4·CULTURE + 0.12·each other
# category; TIIF: the mean of its groups; UniGenBench: the mean of its primary dimensions), and each
# category's mean score
EVAL_SUITE = "eval/{suite}/overall"
EVAL_SUITE_CATEGORY = "eval/{suite}/{category}"

# text reasoning (arithmetic task)
ACCURACY = "accuracy"  # mean correct (0/1) over the step's samples
FORMAT_RATE = "format_rate"  # mean format reward over the step's samples
LENGTH_MEAN = "length/mean"  # mean completion length (the reward's unit)
STEP_LIFT = "step_lift"  # mean over failed samples of (first wrong step credit share) / (its token share)
STEP_LIFT_N = "step_lift/samples"  # failed samples whose step lift is defined
EVAL_ACCURACY = "eval/accuracy"  # held-out pass@1, averaged over every sample
EVAL_ACCURACY_SE = "eval/accuracy_se"  # its standard error over the samples, √(p(1 − p)/n)
EVAL_PASS_K = "eval/pass_at_k"  # held-out share of prompts with ≥ 1 correct sample among their k
EVAL_FORMAT_RATE = "eval/format_rate"
EVAL_LENGTH_MEAN = "eval/length/mean"
