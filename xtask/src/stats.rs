//! The statistics of `cargo xtask bench`: medians, a seeded random number generator,
//! and bootstrap confidence intervals of a ratio (the median of paired rounds'
//! ratios, or of two samples' medians), with the verdict read from them. Pure functions, no I/O: see `docs/performance.md` for the method.

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

/// A ratio ([`round_ratios`], [`unpaired_ratio`]) and its bootstrap interval.
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

/// The median of the per-round ratios `num[i] / den[i]` of two paired samples,
/// and the percentile interval of that median over resampled rounds. Where a
/// machine switches between speeds from one round to the next and both sides
/// of a round share its speed, each round's ratio stays put while the two
/// medians of a resample can land in different modes; so this is the estimate
/// for rounds whose two sides ran right next to each other. Rounds with a
/// missing or unusable side are dropped; `None` if none is left.
pub fn round_ratios(num: &[f64], den: &[f64], rng: &mut Rng) -> Option<RatioEstimate> {
    let pairs: Vec<(f64, f64)> = num
        .iter()
        .zip(den)
        .map(|(a, b)| (*a, *b))
        .filter(|(a, b)| is_usable(*a) && is_usable(*b))
        .collect();
    let ratios: Vec<f64> = pairs.iter().map(|(a, b)| a / b).collect();
    let ratio = median(&ratios)?;
    let (a, b): (Vec<f64>, Vec<f64>) = pairs.iter().copied().unzip();
    let n = ratios.len();
    let mut buf = vec![0.0; n];
    let medians = (0..RESAMPLES)
        .map(|_| {
            for x in buf.iter_mut() {
                *x = ratios[rng.below(n)];
            }
            median(&buf).unwrap_or(ratio)
        })
        .collect();
    Some(RatioEstimate {
        num_median: median(&a)?,
        den_median: median(&b)?,
        ratio,
        ci: percentile_interval(medians, ratio),
        n,
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

/// Fewer values (or pairs) than this give no verdict: with so few, the medians of
/// the resamples take a handful of values and a percentile interval is too
/// narrow to trust (three rounds, one of them in the slow mode, can exclude 1.0).
pub const MIN_FOR_VERDICT: usize = 5;

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
            round_ratios(&v, &v, &mut Rng::new(1)).unwrap(),
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
        let est = round_ratios(&slow, &c, &mut Rng::new(7)).unwrap();
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
        let est = round_ratios(&r, &c, &mut Rng::new(3)).unwrap();
        assert_eq!(Verdict::of(est.ci), Verdict::Same, "{est:?}");
        let est = round_ratios(&[1.0, f64::NAN, 2.0], &[1.0, 5.0, -1.0], &mut Rng::new(3));
        assert_eq!(est.map(|e| (e.n, e.ratio)), Some((1, 1.0)));
        assert!(round_ratios(&[], &[1.0], &mut Rng::new(3)).is_none());
        assert!(unpaired_ratio(&[1.0], &[f64::INFINITY], &mut Rng::new(3)).is_none());
    }

    #[test]
    fn round_ratios_hold_through_a_machine_that_switches_speed() {
        // Rust takes 2 x C in every round; the machine runs at one speed in some
        // rounds and at a third of it in others (both sides of a round alike).
        let c = [10.0, 30.0, 10.0, 30.0, 30.0, 10.0, 10.0, 30.0, 30.0, 10.0];
        let rust: Vec<f64> = c.iter().map(|t| 2.0 * t).collect();
        let est = round_ratios(&rust, &c, &mut Rng::new(5)).unwrap();
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
        let est = round_ratios(&kiara, &c2, &mut Rng::new(5)).unwrap();
        assert!((est.ratio - 1.855).abs() < 0.01, "{est:?}");
        assert!(est.ci.lo > 1.6 && est.ci.hi < 2.3, "{est:?}");
        // One mixed round (C slow, Rust fast) moves the median of ratios little.
        let mut mixed = rust.clone();
        mixed[1] = 20.0;
        let est = round_ratios(&mixed, &c, &mut Rng::new(5)).unwrap();
        assert_eq!(est.ratio, 2.0);
        assert!(est.ci.lo > 1.0, "{est:?}");
        // Unusable rounds are dropped; none left is no estimate.
        let est = round_ratios(&[2.0, f64::NAN, 4.0], &[1.0, 1.0, 0.0], &mut Rng::new(5));
        assert_eq!(est.map(|e| (e.ratio, e.n)), Some((2.0, 1)));
        assert!(round_ratios(&[f64::NAN], &[1.0], &mut Rng::new(5)).is_none());
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
            for paired in [true, false] {
                let f = if paired { round_ratios } else { unpaired_ratio };
                let est = f(&r, &c, &mut Rng::new(case)).unwrap();
                assert!(est.ci.contains(est.ratio), "case {case}: {est:?}");
                assert!(
                    est.ci.lo > 0.0 && est.ci.hi.is_finite(),
                    "case {case}: {est:?}"
                );
                assert_eq!(f(&r, &c, &mut Rng::new(case)), Some(est));
            }
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
            let est = round_ratios(&r, &c, &mut Rng::new(case)).unwrap();
            assert_eq!(Verdict::of(est.ci), Verdict::Slower, "case {case}: {est:?}");
            let noisy: Vec<f64> = c
                .iter()
                .map(|x| x * (0.5 + gen.below(100) as f64 / 100.0))
                .collect();
            let wide = round_ratios(&noisy, &c, &mut Rng::new(case)).unwrap();
            assert!(
                wide.ci.relative_half_width(wide.ratio) >= est.ci.relative_half_width(est.ratio)
            );
        }
    }
}
