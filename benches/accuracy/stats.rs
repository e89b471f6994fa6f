//! Small order statistics for the report (no dependency needed for these).

/// The median of `xs` (mean of the middle two for an even count); `NaN`
/// when empty.
pub fn median(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 0 {
        (v[mid - 1] + v[mid]) / 2.0
    } else {
        v[mid]
    }
}

/// The largest absolute value of `xs`; `NaN` when empty.
pub fn max_abs(xs: &[f64]) -> f64 {
    xs.iter().map(|x| x.abs()).fold(f64::NAN, f64::max)
}

/// Median and max of |x|, for a summary line.
pub struct Summary {
    pub n: usize,
    pub median_abs: f64,
    pub max_abs: f64,
    /// The signed median: shows a bias that the absolute one hides.
    pub median: f64,
}

impl Summary {
    pub fn of(xs: &[f64]) -> Summary {
        let abs: Vec<f64> = xs.iter().map(|x| x.abs()).collect();
        Summary {
            n: xs.len(),
            median_abs: median(&abs),
            max_abs: max_abs(xs),
            median: median(xs),
        }
    }
}
