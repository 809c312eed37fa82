//! The statistics of `cargo xtask bench`: medians, confidence intervals of a
//! ratio (the median of paired rounds' ratios by the sign test; the ratio of
//! two unpaired samples' medians by a seeded bootstrap), and the verdict read
//! from them. Pure functions, no I/O: see `docs/performance.md` for the method.

/// How many bootstrap resamples an interval is computed from.
pub const RESAMPLES: usize = 2000;

/// The confidence level of the intervals.
pub const LEVEL: f64 = 0.95;

/// The seed every interval's generator starts from (mixed with the row's name).
pub const SEED: u64 = 0x5eed_2024_0015_0001;

/// The median of the finite values of `v`, or `None` if there are none.
pub fn median(v: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// The quantile `q` (0 to 1) of sorted values, interpolated linearly between ranks.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let pos = q.clamp(0.0, 1.0) * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

/// SplitMix64: a small, fast, seedable generator; deterministic across platforms,
/// which is all a bootstrap needs (the same data give the same interval).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// A generator seeded with [`SEED`] mixed with `name` (FNV-1a), so that each
    /// row has its own, reproducible stream.
    pub fn for_name(name: &str) -> Self {
        let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        Rng::new(SEED ^ hash)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A uniform index below `n` (`n` > 0; the modulo bias is below 2^-40 for the
    /// sample sizes used here).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// A confidence interval.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Interval {
    /// Lower bound.
    pub lo: f64,
    /// Upper bound.
    pub hi: f64,
}

impl Interval {
    /// Whether `x` lies in the interval (bounds included).
    #[cfg(test)]
    pub fn contains(&self, x: f64) -> bool {
        self.lo <= x && x <= self.hi
    }

    /// Half the interval's width relative to `center`: 0.05 is "±5%".
    pub fn relative_half_width(&self, center: f64) -> f64 {
        (self.hi - self.lo) / (2.0 * center.abs())
    }
}

/// A ratio ([`round_ratios`], [`unpaired_ratio`]) and its interval.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RatioEstimate {
    /// Median of the numerator's sample.
    pub num_median: f64,
    /// Median of the denominator's sample.
    pub den_median: f64,
    /// `num_median / den_median` ([`round_ratios`]: the median of the rounds'
    /// ratios).
    pub ratio: f64,
    /// The [`LEVEL`] interval of the ratio.
    pub ci: Interval,
    /// How many values (or pairs, for a paired estimate) it rests on.
    pub n: usize,
}

/// The percentile interval of the bootstrap ratios, widened if needed to contain
/// the point estimate (the percentile method does not promise that with a few
/// values, whose medians take only a few distinct values).
fn percentile_interval(mut ratios: Vec<f64>, estimate: f64) -> Interval {
    ratios.sort_by(f64::total_cmp);
    let tail = (1.0 - LEVEL) / 2.0;
    Interval {
        lo: quantile(&ratios, tail).min(estimate),
        hi: quantile(&ratios, 1.0 - tail).max(estimate),
    }
}

/// Keeps the values usable in a ratio: finite and positive.
fn usable(v: &[f64]) -> Vec<f64> {
    v.iter().copied().filter(|&x| is_usable(x)).collect()
}

/// Whether a figure can take part in a ratio: finite and above 0 (a failed
/// run gives NaN, and a ratio over 0 is no figure).
pub fn is_usable(x: f64) -> bool {
    x.is_finite() && x > 0.0
}

/// The ranks of the order-statistic interval of a median of `n` values, and
/// its coverage: the interval from the `k`-th smallest value to the `k`-th
/// largest holds the true median with probability `1 - 2 P(B < k)`, `B`
/// binomial with `n` trials of one half, whatever the values' distribution
/// (the sign test's interval). `k` is the largest rank whose coverage is at
/// least [`LEVEL`]; `None` below 6 values, where even the smallest to the
/// largest (`k` = 1) covers less (5 values: 93.75%).
pub fn sign_rank(n: usize) -> Option<(usize, f64)> {
    let tail = (1.0 - LEVEL) / 2.0;
    // P(B = j), then P(B < k) as the sum of P(B = j) for j below k.
    let mut pmf = 0.5f64.powi(i32::try_from(n).ok()?);
    let mut below = 0.0;
    let mut k = 0;
    for j in 0..n {
        if below + pmf > tail {
            break;
        }
        below += pmf;
        k = j + 1;
        pmf *= (n - j) as f64 / (j + 1) as f64;
    }
    let coverage = 1.0 - 2.0 * below;
    (k > 0).then_some((k, coverage))
}

/// The interval of the median of `values` at [`LEVEL`] ([`sign_rank`]); below
/// 6 values, the smallest to the largest, which covers less.
fn median_interval(values: &[f64]) -> Interval {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let k = sign_rank(sorted.len()).map_or(1, |(k, _)| k);
    Interval {
        lo: sorted[k - 1],
        hi: sorted[sorted.len() - k],
    }
}

/// The median of the per-round ratios `num[i] / den[i]` of two paired samples,
/// and the sign test's interval of that median ([`sign_rank`]). Where a
/// machine switches between speeds from one round to the next and both sides
/// of a round share its speed, each round's ratio stays put while the medians
/// of the two sides can land in different modes; so this is the estimate for
/// rounds whose two sides ran right next to each other. The interval assumes
/// only that the rounds' ratios are independent draws of one distribution, any
/// shape (this guest's are bimodal). Rounds with a missing or unusable side are
/// dropped; `None` if none is left.
pub fn round_ratios(num: &[f64], den: &[f64]) -> Option<RatioEstimate> {
    let pairs: Vec<(f64, f64)> = num
        .iter()
        .zip(den)
        .map(|(a, b)| (*a, *b))
        .filter(|(a, b)| is_usable(*a) && is_usable(*b))
        .collect();
    let ratios: Vec<f64> = pairs.iter().map(|(a, b)| a / b).collect();
    let ratio = median(&ratios)?;
    let (a, b): (Vec<f64>, Vec<f64>) = pairs.iter().copied().unzip();
    Some(RatioEstimate {
        num_median: median(&a)?,
        den_median: median(&b)?,
        ratio,
        ci: median_interval(&ratios),
        n: ratios.len(),
    })
}

/// Like [`round_ratios`] for two samples taken apart (their values do not pair
/// up): each is resampled on its own. `n` is the smaller sample's size.
pub fn unpaired_ratio(num: &[f64], den: &[f64], rng: &mut Rng) -> Option<RatioEstimate> {
    let (a, b) = (usable(num), usable(den));
    let (na, nb) = (median(&a)?, median(&b)?);
    let mut resample = |v: &[f64], buf: &mut Vec<f64>| {
        buf.clear();
        buf.extend((0..v.len()).map(|_| v[rng.below(v.len())]));
        median(buf).unwrap_or(f64::NAN)
    };
    let (mut ra, mut rb) = (Vec::new(), Vec::new());
    let ratios = (0..RESAMPLES)
        .map(|_| resample(&a, &mut ra) / resample(&b, &mut rb))
        .collect();
    Some(RatioEstimate::new(na, nb, ratios, a.len().min(b.len())))
}

impl RatioEstimate {
    /// The estimate `num_median / den_median` with the percentile interval of
    /// its bootstrap `ratios`, from `n` values.
    fn new(num_median: f64, den_median: f64, ratios: Vec<f64>, n: usize) -> Self {
        let ratio = num_median / den_median;
        RatioEstimate {
            num_median,
            den_median,
            ratio,
            ci: percentile_interval(ratios, ratio),
            n,
        }
    }
}

/// Fewer values (or pairs) than this give no verdict: below 6, no interval of
/// the median reaches [`LEVEL`] without assumptions ([`sign_rank`]), and a
/// bootstrap's medians take a handful of values (three rounds, one of them in
/// the slow mode, can exclude 1.0).
pub const MIN_FOR_VERDICT: usize = 6;

/// The words for an estimate resting on fewer than [`MIN_FOR_VERDICT`] values.
pub const TOO_FEW: &str = "too few rounds";

/// What a row's interval says of Rust against C.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The whole interval is below 1.0: Rust takes less time.
    Faster,
    /// The whole interval is above 1.0: Rust takes more time.
    Slower,
    /// The interval contains 1.0.
    Same,
}

impl Verdict {
    /// The verdict of a Rust/C time ratio's interval.
    pub fn of(ci: Interval) -> Self {
        if ci.hi < 1.0 {
            Verdict::Faster
        } else if ci.lo > 1.0 {
            Verdict::Slower
        } else {
            Verdict::Same
        }
    }

    /// The words in the table and the JSON.
    pub fn words(self) -> &'static str {
        match self {
            Verdict::Faster => "faster",
            Verdict::Slower => "slower",
            Verdict::Same => "same within noise",
        }
    }
}

/// Where an interval stands against a target: `at_least` says whether the
/// value must be at least the target (throughput) or at most (time).
pub fn against_target(ci: Interval, target: f64, at_least: bool) -> &'static str {
    let (good, bad) = if at_least {
        (ci.lo >= target, ci.hi < target)
    } else {
        (ci.hi <= target, ci.lo > target)
    };
    match (good, bad) {
        (true, _) => "met",
        (_, true) => "MISSED",
        _ => "undecided",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_quantiles() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[f64::NAN, 1.0, 3.0]), Some(2.0));
        assert_eq!(median(&[]), None);
        assert_eq!(quantile(&[0.0, 10.0], 0.25), 2.5);
        assert_eq!(quantile(&[1.0, 2.0, 3.0], 1.0), 3.0);
    }

    #[test]
    fn the_generator_is_deterministic_and_spread() {
        let (mut a, mut b) = (Rng::for_name("x 64"), Rng::for_name("x 64"));
        assert_eq!(a.next_u64(), b.next_u64());
        assert_ne!(
            Rng::for_name("x 64").next_u64(),
            Rng::for_name("x 2").next_u64()
        );
        let mut counts = [0usize; 4];
        for _ in 0..4000 {
            counts[a.below(4)] += 1;
        }
        assert!(
            counts.iter().all(|&c| (850..1150).contains(&c)),
            "{counts:?}"
        );
    }

    #[test]
    fn identical_samples_give_one() {
        let v = [10.0, 11.0, 9.5, 30.0, 10.2];
        for est in [
            round_ratios(&v, &v).unwrap(),
            unpaired_ratio(&[5.0; 6], &[5.0; 6], &mut Rng::new(1)).unwrap(),
        ] {
            assert_eq!(est.ratio, 1.0);
            assert_eq!(est.ci, Interval { lo: 1.0, hi: 1.0 });
            assert_eq!(Verdict::of(est.ci), Verdict::Same);
        }
    }

    #[test]
    fn a_clear_shift_excludes_one() {
        let c = [10.0, 10.5, 9.8, 10.1, 10.3, 9.9, 10.2, 10.0];
        let slow: Vec<f64> = c.iter().map(|x| x * 1.3).collect();
        let est = round_ratios(&slow, &c).unwrap();
        assert!(est.ci.lo > 1.0, "{est:?}");
        assert_eq!(Verdict::of(est.ci), Verdict::Slower);
        let est = unpaired_ratio(&c, &slow, &mut Rng::new(7)).unwrap();
        assert!(est.ci.hi < 1.0, "{est:?}");
        assert_eq!(Verdict::of(est.ci), Verdict::Faster);
    }

    #[test]
    fn noise_gives_same_and_bad_values_are_dropped() {
        let c = [10.0, 14.0, 9.0, 12.0, 10.5];
        let r = [11.0, 9.5, 13.0, 10.0, 12.5];
        let est = round_ratios(&r, &c).unwrap();
        assert_eq!(Verdict::of(est.ci), Verdict::Same, "{est:?}");
        let est = round_ratios(&[1.0, f64::NAN, 2.0], &[1.0, 5.0, -1.0]);
        assert_eq!(est.map(|e| (e.n, e.ratio)), Some((1, 1.0)));
        assert!(round_ratios(&[], &[1.0]).is_none());
        assert!(unpaired_ratio(&[1.0], &[f64::INFINITY], &mut Rng::new(3)).is_none());
    }

    #[test]
    fn round_ratios_hold_through_a_machine_that_switches_speed() {
        // Rust takes 2 x C in every round; the machine runs at one speed in some
        // rounds and at a third of it in others (both sides of a round alike).
        let c = [10.0, 30.0, 10.0, 30.0, 30.0, 10.0, 10.0, 30.0, 30.0, 10.0];
        let rust: Vec<f64> = c.iter().map(|t| 2.0 * t).collect();
        let est = round_ratios(&rust, &c).unwrap();
        assert_eq!(
            (est.ratio, est.ci.lo, est.ci.hi, est.n),
            (2.0, 2.0, 2.0, 10)
        );
        assert_eq!((est.num_median, est.den_median), (40.0, 20.0));
        // Real rounds (a bench run of session 18, the 64 B round trip against
        // twice ib_send_lat around it): the guest switched speed between
        // rounds, and once within one (the eighth). The ratio of the medians of
        // resampled rounds, the bench's estimate until then, put the two medians
        // in different modes and gave 1.43-2.25 on these rounds; the rounds' own
        // ratios stay put.
        let kiara = [
            187.6, 192.1, 73.0, 178.6, 162.7, 149.4, 175.9, 77.2, 170.5, 79.9,
        ];
        let c2: Vec<f64> = [
            (40.50, 37.41),
            (45.13, 42.57),
            (20.75, 20.40),
            (52.75, 46.61),
            (42.24, 37.72),
            (46.16, 37.99),
            (41.86, 49.31),
            (49.24, 20.60),
            (50.80, 54.58),
            (20.62, 21.12),
        ]
        .iter()
        .map(|(before, after)| before + after)
        .collect();
        let est = round_ratios(&kiara, &c2).unwrap();
        assert!((est.ratio - 1.855).abs() < 0.01, "{est:?}");
        assert!(est.ci.lo > 1.6 && est.ci.hi < 2.3, "{est:?}");
        // One mixed round (C slow, Rust fast) moves the median of ratios little.
        let mut mixed = rust.clone();
        mixed[1] = 20.0;
        let est = round_ratios(&mixed, &c).unwrap();
        assert_eq!(est.ratio, 2.0);
        assert!(est.ci.lo > 1.0, "{est:?}");
        // Unusable rounds are dropped; none left is no estimate.
        let est = round_ratios(&[2.0, f64::NAN, 4.0], &[1.0, 1.0, 0.0]);
        assert_eq!(est.map(|e| (e.ratio, e.n)), Some((2.0, 1)));
        assert!(round_ratios(&[f64::NAN], &[1.0]).is_none());
    }

    #[test]
    fn sign_ranks_and_their_coverage() {
        assert_eq!(sign_rank(5), None);
        assert_eq!(sign_rank(0), None);
        let (k, cover) = sign_rank(6).unwrap();
        assert_eq!(k, 1);
        assert!((cover - (1.0 - 2.0 / 64.0)).abs() < 1e-12);
        // Ten rounds: the 2nd to the 9th value, 1 - 2 * 11/1024.
        let (k, cover) = sign_rank(10).unwrap();
        assert_eq!(k, 2);
        assert!((cover - (1.0 - 22.0 / 1024.0)).abs() < 1e-12);
        // P(B < k), B binomial(n, 1/2), from binomial coefficients.
        let below = |n: usize, k: usize| {
            let mut c = 1u128;
            let mut sum = 0u128;
            for j in 0..k {
                sum += c;
                c = c * (n - j) as u128 / (j + 1) as u128;
            }
            sum as f64 / 2f64.powi(n as i32)
        };
        for n in 6..=100 {
            let (k, cover) = sign_rank(n).unwrap();
            assert!((cover - (1.0 - 2.0 * below(n, k))).abs() < 1e-9, "n {n}");
            assert!(cover >= LEVEL && 2 * k <= n, "n {n}: k {k}, {cover}");
            // One rank further in would cover less than LEVEL.
            assert!(1.0 - 2.0 * below(n, k + 1) < LEVEL, "n {n}: k {k}");
        }
        assert_eq!(sign_rank(30).unwrap().0, 10);
        let est = round_ratios(&[1.0, 2.0, 3.0, 4.0, 5.0], &[1.0; 5]).unwrap();
        assert_eq!(est.ci, Interval { lo: 1.0, hi: 5.0 });
    }

    #[test]
    fn property_the_interval_covers_the_median_as_it_says() {
        // Skewed and bimodal draws with a known median: an exponential (median
        // ln 2) and, a fifth of the time, 1.8 times one, like this guest's slow
        // mode; the median of that mixture is found by bisection.
        let mixture_cdf = |x: f64| 0.8 * (1.0 - (-x).exp()) + 0.2 * (1.0 - (-x / 1.8).exp());
        let (mut lo, mut hi) = (0.0, 10.0);
        for _ in 0..100 {
            let mid = (lo + hi) / 2.0;
            if mixture_cdf(mid) < 0.5 {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let true_median = lo;
        let mut gen = Rng::new(15);
        let mut draw = || {
            let u = (gen.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
            let slow = if gen.below(5) == 0 { 1.8 } else { 1.0 };
            -(1.0 - u).ln() * slow
        };
        for n in [6, 10, 20] {
            let trials = 4000;
            let covered = (0..trials)
                .filter(|_| {
                    let ratios: Vec<f64> = (0..n).map(|_| draw()).collect();
                    round_ratios(&ratios, &vec![1.0; n])
                        .unwrap()
                        .ci
                        .contains(true_median)
                })
                .count();
            let share = covered as f64 / trials as f64;
            let (_, promised) = sign_rank(n).unwrap();
            // Within three standard errors of the promise (about 0.008).
            assert!(
                (share - promised).abs() < 0.012,
                "n {n}: {share} against {promised}"
            );
        }
    }

    #[test]
    fn targets() {
        let ci = Interval { lo: 0.85, hi: 0.95 };
        assert_eq!(against_target(ci, 0.8, true), "met");
        assert_eq!(against_target(ci, 0.9, true), "undecided");
        assert_eq!(against_target(ci, 1.0, true), "MISSED");
        assert_eq!(against_target(ci, 1.0, false), "met");
        assert_eq!(against_target(ci, 0.8, false), "MISSED");
        assert!((ci.relative_half_width(0.9) - 0.0556).abs() < 1e-3);
    }

    /// A random sample: `n` values around `center`, some in a slow mode.
    fn sample(rng: &mut Rng, n: usize, center: f64) -> Vec<f64> {
        (0..n)
            .map(|_| {
                let jitter = (rng.below(2001) as f64 - 1000.0) / 10_000.0;
                let mode = if rng.below(5) == 0 { 1.8 } else { 1.0 };
                center * mode * (1.0 + jitter)
            })
            .collect()
    }

    #[test]
    fn property_the_interval_holds_the_estimate_and_is_deterministic() {
        let mut gen = Rng::new(42);
        for case in 0..100 {
            let n = 1 + gen.below(25);
            let (c, r) = (sample(&mut gen, n, 10.0), sample(&mut gen, n, 12.0));
            let paired = round_ratios(&r, &c).unwrap();
            let unpaired = unpaired_ratio(&r, &c, &mut Rng::new(case)).unwrap();
            for est in [paired, unpaired] {
                assert!(est.ci.contains(est.ratio), "case {case}: {est:?}");
                assert!(
                    est.ci.lo > 0.0 && est.ci.hi.is_finite(),
                    "case {case}: {est:?}"
                );
            }
            assert_eq!(round_ratios(&r, &c), Some(paired));
            assert_eq!(unpaired_ratio(&r, &c, &mut Rng::new(case)), Some(unpaired));
        }
    }

    #[test]
    fn property_a_large_shift_is_found_and_noise_widens_the_interval() {
        let mut gen = Rng::new(9);
        for case in 0..50 {
            let c: Vec<f64> = (0..30)
                .map(|_| 10.0 + gen.below(100) as f64 / 100.0)
                .collect();
            let r: Vec<f64> = c.iter().map(|x| x * 1.5).collect();
            let est = round_ratios(&r, &c).unwrap();
            assert_eq!(Verdict::of(est.ci), Verdict::Slower, "case {case}: {est:?}");
            let noisy: Vec<f64> = c
                .iter()
                .map(|x| x * (0.5 + gen.below(100) as f64 / 100.0))
                .collect();
            let wide = round_ratios(&noisy, &c).unwrap();
            assert!(
                wide.ci.relative_half_width(wide.ratio) >= est.ci.relative_half_width(est.ratio)
            );
        }
    }
}
