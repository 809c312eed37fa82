//! The statistics of `cargo xtask bench`: medians, the sign test's confidence
//! interval of the median of paired rounds' ratios, and the verdict read from
//! it. Pure functions, no I/O: see `docs/performance.md` for the method.

/// The confidence level of the intervals.
pub const LEVEL: f64 = 0.95;

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

/// Whether a row with `estimate` needs another round: to be within ± `precision`
/// of its ratio, or to have the rounds a verdict needs at all
/// ([`MIN_FOR_VERDICT`]). The rule looks at the interval's width only, never at
/// where it lies against 1.0 or a target: stopping once a verdict comes out would
/// make false verdicts likelier than the interval's level says.
pub fn needs_more(estimate: Option<RatioEstimate>, precision: f64) -> bool {
    match estimate {
        Some(e) if e.n < MIN_FOR_VERDICT => true,
        Some(e) => e.ci.relative_half_width(e.ratio) > precision,
        // Nothing to compare after the first rounds: more would not help.
        None => false,
    }
}

/// A ratio of paired rounds ([`round_ratios`]) and its interval.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RatioEstimate {
    /// Median of the numerator's sample (the rounds used).
    pub num_median: f64,
    /// Median of the denominator's sample (the rounds used).
    pub den_median: f64,
    /// The median of the rounds' ratios.
    pub ratio: f64,
    /// The [`LEVEL`] interval of the ratio from [`MIN_FOR_VERDICT`] rounds on;
    /// below that, the smallest to the largest ratio, which covers less
    /// (`1 - 2^(1 - n)`), and no verdict is read from it.
    pub ci: Interval,
    /// How many pairs it rests on.
    pub n: usize,
}

/// Whether a figure can take part in a ratio: finite and above 0 (a failed
/// run gives NaN, and a ratio over 0 is no figure).
fn is_usable(x: f64) -> bool {
    x.is_finite() && x > 0.0
}

/// The ranks of the order-statistic interval of a median of `n` values, and
/// its coverage: the interval from the `k`-th smallest value to the `k`-th
/// largest holds the true median with probability `1 - 2 P(B < k)`, `B`
/// binomial with `n` trials of one half, whatever the values' distribution
/// (the sign test's interval). `k` is the largest rank whose coverage is at
/// least [`LEVEL`]; `None` below 6 values, where even the smallest to the
/// largest (`k` = 1) covers less (5 values: 93.75%), and above 1,000, where
/// `2^-n` is lost to floating point (the bench stops at 100 rounds).
pub fn sign_rank(n: usize) -> Option<(usize, f64)> {
    if n > 1000 {
        return None;
    }
    let tail = (1.0 - LEVEL) / 2.0;
    // P(B = j), then P(B < k) as the sum of P(B = j) for j below k.
    // n is at most 1000 here, so it fits an i32.
    let mut pmf = 0.5f64.powi(n as i32);
    let mut below = 0.0;
    let mut k = 0;
    for j in 0..n / 2 {
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
/// 6 values, the smallest to the largest, which covers less; `None` if there
/// are none.
fn median_interval(values: &[f64]) -> Option<Interval> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let k = sign_rank(sorted.len()).map_or(1, |(k, _)| k);
    Some(Interval {
        lo: *sorted.get(k - 1)?,
        hi: *sorted.get(sorted.len() - k)?,
    })
}

/// The median of the per-round ratios `num[i] / den[i]` of two paired samples,
/// and the sign test's interval of that median ([`sign_rank`]). Where a
/// machine switches between speeds from one round to the next and both sides
/// of a round share its speed, each round's ratio stays put while the medians
/// of the two sides can land in different modes; so this is the estimate for
/// rounds whose two sides ran right next to each other (or came from one run,
/// as a run's p99 and p50). The interval assumes only that the rounds' ratios
/// are independent draws of one distribution, any shape (this guest's are
/// bimodal). Rounds with a missing or unusable side, or whose ratio is no
/// usable figure, are dropped; `None` if none is left.
pub fn round_ratios(num: &[f64], den: &[f64]) -> Option<RatioEstimate> {
    let pairs: Vec<(f64, f64)> = num
        .iter()
        .zip(den)
        .map(|(a, b)| (*a, *b))
        .filter(|&(a, b)| is_usable(a) && is_usable(b) && is_usable(a / b))
        .collect();
    let ratios: Vec<f64> = pairs.iter().map(|(a, b)| a / b).collect();
    let (a, b): (Vec<f64>, Vec<f64>) = pairs.iter().copied().unzip();
    Some(RatioEstimate {
        num_median: median(&a)?,
        den_median: median(&b)?,
        ratio: median(&ratios)?,
        ci: median_interval(&ratios)?,
        n: ratios.len(),
    })
}

/// Fewer pairs than this give no verdict: below 6, no interval of the median
/// reaches [`LEVEL`] without assumptions ([`sign_rank`]).
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

    /// SplitMix64: a small, seedable generator for the tests' random samples.
    struct Rng(u64);

    impl Rng {
        fn new(seed: u64) -> Self {
            Rng(seed)
        }

        fn next_u64(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }

        /// A uniform index below `n`.
        fn below(&mut self, n: usize) -> usize {
            (self.next_u64() % n as u64) as usize
        }

        /// A uniform value in [0, 1).
        fn unit(&mut self) -> f64 {
            (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[f64::NAN, 1.0, 3.0]), Some(2.0));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn the_generator_is_spread() {
        let mut a = Rng::new(64);
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
        let est = round_ratios(&v, &v).unwrap();
        assert_eq!(est.ratio, 1.0);
        assert_eq!(est.ci, Interval { lo: 1.0, hi: 1.0 });
        assert_eq!(Verdict::of(est.ci), Verdict::Same);
    }

    #[test]
    fn a_clear_shift_excludes_one() {
        let c = [10.0, 10.5, 9.8, 10.1, 10.3, 9.9, 10.2, 10.0];
        // 1.3 x C, give or take a few percent each round.
        let jitter = [1.0, 0.97, 1.04, 0.99, 1.02, 0.96, 1.03, 1.01];
        let slow: Vec<f64> = c.iter().zip(jitter).map(|(x, j)| x * 1.3 * j).collect();
        let est = round_ratios(&slow, &c).unwrap();
        // Eight rounds: k = 1, the smallest to the largest ratio.
        assert_eq!(sign_rank(8).map(|(k, _)| k), Some(1));
        assert!((est.ci.lo - 1.3 * 0.96).abs() < 1e-9, "{est:?}");
        assert!((est.ci.hi - 1.3 * 1.04).abs() < 1e-9, "{est:?}");
        assert_eq!(Verdict::of(est.ci), Verdict::Slower);
        let est = round_ratios(&c, &slow).unwrap();
        assert_eq!(Verdict::of(est.ci), Verdict::Faster, "{est:?}");
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
        assert!(round_ratios(&[1.0], &[f64::INFINITY]).is_none());
        // A ratio that overflows is no figure either.
        let est = round_ratios(&[f64::MAX, 2.0], &[f64::MIN_POSITIVE, 1.0]);
        assert_eq!(est.map(|e| (e.n, e.ratio)), Some((1, 2.0)));
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
        // From the 2nd to the 9th of the ten ratios (the ninth round's 1.618
        // and the second's 2.190): the smallest, the mixed eighth round's
        // 1.105, and the largest, the first round's 2.408, are left out.
        assert!((est.ci.lo - 1.61795).abs() < 1e-4, "{est:?}");
        assert!((est.ci.hi - 2.19042).abs() < 1e-4, "{est:?}");
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
        // Past 1,000 values the binomial's first term is lost to floating point.
        assert!(sign_rank(1000).is_some() && sign_rank(1001).is_none());
        let est = round_ratios(&[1.0, 2.0, 3.0, 4.0, 5.0], &[1.0; 5]).unwrap();
        assert_eq!(est.ci, Interval { lo: 1.0, hi: 5.0 });
    }

    #[test]
    fn property_the_interval_covers_the_median_as_it_says() {
        // Bimodal, skewed draws with a known median, like this guest's two
        // speeds: four in five uniform on [1.0, 1.2], one in five on [1.8,
        // 2.2]. Half the mass lies below 1.0 + 0.2 * 0.5 / 0.8 = 1.125.
        let true_median = 1.125;
        let mut gen = Rng::new(15);
        let mut draw = || {
            let u = gen.unit();
            if gen.below(5) == 0 {
                1.8 + 0.4 * u
            } else {
                1.0 + 0.2 * u
            }
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
            // Within four standard errors of the promise (each about 0.003).
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
    fn property_the_interval_holds_the_estimate() {
        let mut gen = Rng::new(42);
        for case in 0..100 {
            let n = 1 + gen.below(25);
            let (c, r) = (sample(&mut gen, n, 10.0), sample(&mut gen, n, 12.0));
            let est = round_ratios(&r, &c).unwrap();
            assert!(est.ci.contains(est.ratio), "case {case}: {est:?}");
            assert!(
                est.ci.lo > 0.0 && est.ci.hi.is_finite(),
                "case {case}: {est:?}"
            );
        }
    }

    #[test]
    fn property_a_large_shift_is_found_and_noise_widens_the_interval() {
        let mut gen = Rng::new(9);
        for case in 0..50 {
            let c: Vec<f64> = (0..30)
                .map(|_| 10.0 + gen.below(100) as f64 / 100.0)
                .collect();
            // 1.5 x C within ±5% each round: found, and narrow.
            let r: Vec<f64> = c
                .iter()
                .map(|x| x * 1.5 * (0.95 + gen.below(101) as f64 / 1000.0))
                .collect();
            let est = round_ratios(&r, &c).unwrap();
            assert_eq!(Verdict::of(est.ci), Verdict::Slower, "case {case}: {est:?}");
            assert!(est.ci.relative_half_width(est.ratio) < 0.05, "{est:?}");
            // Rust at 0.5 to 1.5 x these rounds of C: a wider interval.
            let noisy: Vec<f64> = c
                .iter()
                .map(|x| x * (0.5 + gen.below(101) as f64 / 100.0))
                .collect();
            let wide = round_ratios(&noisy, &c).unwrap();
            assert!(
                wide.ci.relative_half_width(wide.ratio) > est.ci.relative_half_width(est.ratio),
                "case {case}: {wide:?} against {est:?}"
            );
        }
    }
}
