//! A device slot's time as a straight line in its rows, fitted to recent steps, and the
//! split under which such lines finish together.
//!
//! A replica's step holds work that grows with its rows and work that does not (kernel
//! launches, waits, the output device's own share): `seconds = fixed + per_row * rows`. A
//! time-per-row estimate reads the fixed part as slowness, and worst on the smaller shard,
//! which then loses rows and looks slower still; the line keeps the two apart, so that the
//! split it asks for does not feed on itself.

/// How far from its line a step's time has to be for the slot's line to start afresh: the
/// device changed (another load, other clocks), and the steps before would bend the new line
/// (a slot twice as fast as its old line drew a line that overshot the balance).
const CHANGED: f64 = 0.25;

/// Weighted sums over a slot's measured steps, each step's weight `(1 - damping)` times the
/// one after it: enough for a least-squares line of seconds against rows.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Recent {
    weight: f64,
    rows: f64,
    rows_squared: f64,
    seconds: f64,
    rows_seconds: f64,
    /// The last slope fitted from steps of different sizes, kept while the recent steps
    /// all have one size (a split that holds still measures no slope).
    slope: Option<f64>,
    /// The recent steps' squared misses, relative to what the line expected of them: the
    /// noise of this slot's times (kept when the line starts afresh).
    misses: f64,
}

/// Seconds a step takes on a slot: `fixed + per_row * rows`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Line {
    pub(crate) fixed: f64,
    pub(crate) per_row: f64,
}

impl Line {
    pub(crate) fn at(&self, rows: f64) -> f64 {
        self.fixed + self.per_row * rows
    }
}

impl Recent {
    /// These sums after a step of `rows` rows that took `seconds`, moved `damping` of the
    /// way to it; started afresh from it where it is further than [`CHANGED`] from the line.
    pub(crate) fn add(self, rows: f64, seconds: f64, damping: f64) -> Self {
        let keep = 1.0 - damping;
        let mut misses = self.misses;
        if let Some(line) = self.line() {
            let miss = seconds / line.at(rows) - 1.0;
            if miss.abs() > CHANGED {
                let fresh = Self::default().add(rows, seconds, damping);
                return Self { misses, ..fresh };
            }
            misses = keep * misses + damping * miss * miss;
        }
        let mut next = Self {
            weight: keep * self.weight + damping,
            rows: keep * self.rows + damping * rows,
            rows_squared: keep * self.rows_squared + damping * rows * rows,
            seconds: keep * self.seconds + damping * seconds,
            rows_seconds: keep * self.rows_seconds + damping * rows * seconds,
            slope: self.slope,
            misses,
        };
        if let Some(slope) = next.fitted_slope() {
            next.slope = Some(slope);
        }
        next
    }

    /// The least-squares slope where the recent steps' sizes spread over a row or more and
    /// it is positive.
    fn fitted_slope(&self) -> Option<f64> {
        let mean_rows = self.rows / self.weight;
        let variance = self.rows_squared / self.weight - mean_rows * mean_rows;
        if variance < 1.0 {
            return None;
        }
        let covariance = self.rows_seconds / self.weight - mean_rows * self.seconds / self.weight;
        Some(covariance / variance).filter(|slope| *slope > 0.0)
    }

    /// How far this slot's times stray from its line, relative: the root of the recent
    /// squared misses.
    pub(crate) fn noise(&self) -> f64 {
        self.misses.sqrt()
    }

    /// The line through the recent steps' mean with the last fitted slope; through the
    /// origin (all of the time per row) before any slope was fitted or where that line
    /// would have a negative fixed part. `None` before the first step.
    pub(crate) fn line(&self) -> Option<Line> {
        if self.weight <= 0.0 {
            return None;
        }
        let rows = self.rows / self.weight;
        let seconds = self.seconds / self.weight;
        let through_origin = Line {
            fixed: 0.0,
            per_row: seconds / rows,
        };
        let line = match self.slope {
            Some(per_row) => Line {
                fixed: seconds - per_row * rows,
                per_row,
            },
            None => through_origin,
        };
        Some(if line.fixed < 0.0 {
            through_origin
        } else {
            line
        })
    }
}

/// The rows (fractional) that `lines` would finish together with, `total` in all and at
/// least one each: the common finish time `T` where `sum max(1, (T - fixed) / per_row)` is
/// `total`, found by bisection.
pub(crate) fn equal_finish(lines: &[Line], total: f64) -> Vec<f64> {
    let rows_at = |finish: f64| -> Vec<f64> {
        (lines.iter())
            .map(|line| ((finish - line.fixed) / line.per_row).max(1.0))
            .collect()
    };
    let sum = |finish: f64| rows_at(finish).iter().sum::<f64>();
    let mut low = 0.0;
    let mut high = (lines.iter())
        .map(|line| line.at(total))
        .fold(0.0, f64::max);
    for _ in 0..200 {
        let middle = 0.5 * (low + high);
        match sum(middle) < total {
            true => low = middle,
            false => high = middle,
        }
    }
    rows_at(high)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recent(steps: &[(f64, f64)], damping: f64) -> Recent {
        (steps.iter()).fold(Recent::default(), |recent, &(n, t)| {
            recent.add(n, t, damping)
        })
    }

    /// Steps of two sizes give the line; steps of one size keep the slope and move the
    /// fixed part; a line below the origin falls back to time per row.
    #[test]
    fn the_line_follows_the_recent_steps() {
        let line = recent(&[(100.0, 0.3), (200.0, 0.5)], 0.5).line().unwrap();
        assert!((line.per_row - 0.002).abs() < 1e-12 && (line.fixed - 0.1).abs() < 1e-9);
        let one_size = recent(&[(100.0, 0.3)], 0.5).line().unwrap();
        assert_eq!(one_size.fixed, 0.0);
        assert!((one_size.per_row - 0.003).abs() < 1e-12);
        let mut held = recent(&[(100.0, 0.3), (200.0, 0.5)], 0.5);
        for _ in 0..40 {
            held = held.add(200.0, 0.5, 0.5);
        }
        let line = held.line().unwrap();
        assert!((line.per_row - 0.002).abs() < 1e-9, "{line:?}");
        assert!((line.fixed - 0.1).abs() < 1e-6, "{line:?}");
        let below = recent(&[(100.0, 0.1), (200.0, 0.5)], 0.5).line().unwrap();
        assert_eq!(below.fixed, 0.0);
    }

    /// Lines with a fixed part finish together; a slot that would need less than a row keeps
    /// one.
    #[test]
    fn equal_finish_times() {
        let lines = [
            Line {
                fixed: 0.05,
                per_row: 0.001,
            },
            Line {
                fixed: 0.05,
                per_row: 0.002,
            },
        ];
        let rows = equal_finish(&lines, 600.0);
        assert!(
            (rows[0] - 400.0).abs() < 1e-6 && (rows[1] - 200.0).abs() < 1e-6,
            "{rows:?}"
        );
        let busy = [
            Line {
                fixed: 10.0,
                per_row: 0.001,
            },
            Line {
                fixed: 0.0,
                per_row: 0.001,
            },
        ];
        let rows = equal_finish(&busy, 600.0);
        assert!(
            (rows[0] - 1.0).abs() < 1e-6 && (rows[1] - 599.0).abs() < 1e-6,
            "{rows:?}"
        );
    }
}
