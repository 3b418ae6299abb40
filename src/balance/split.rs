//! The next step's split from the slots' lines and replica-making times: which devices take
//! part, then how their rows move.

use super::line::{Line, equal_finish};

/// The split of `total` rows for the slots' time `lines` and replica-making times `moves`.
///
/// First which slots take part: a slot is left out (weight zero) where the step is predicted
/// to finish sooner, by more than `tolerance` of it, without it, and one left out comes back
/// where the step is predicted to finish that much sooner with it (a step's predicted finish:
/// the `moves` of the slots taking part, made one after the other on the calling thread, then
/// the slowest of their lines at the rows under which they would finish together). A change
/// of the slots taking part moves straight to that split.
///
/// Otherwise, among the slots with a line, the rows they hold together shared so that they
/// would finish together (each keeping a row, no shard more than doubled or halved in one
/// move), unless that move would bring the slowest predicted finish forward by `tolerance` of
/// it or less. Slots without a line keep their weight.
pub(crate) fn next_weights(
    weights: &[f64],
    lines: &[Option<Line>],
    moves: &[f64],
    total: f64,
    tolerance: f64,
) -> Vec<f64> {
    let known: Vec<(usize, Line)> = (lines.iter().enumerate())
        .filter_map(|(slot, line)| line.map(|line| (slot, line)))
        .collect();
    if known.len() < 2 {
        return weights.to_vec();
    }
    let held: f64 = known.iter().map(|&(slot, _)| weights[slot] * total).sum();
    let taking_part: Vec<bool> = known.iter().map(|&(slot, _)| weights[slot] > 0.0).collect();
    let chosen = slots_taking_part(&known, moves, held, tolerance, taking_part.clone());
    if chosen != taking_part {
        let (slots, lines): (Vec<usize>, Vec<Line>) = taking(&known, &chosen).into_iter().unzip();
        let mut next = weights.to_vec();
        for &(slot, _) in &known {
            next[slot] = 0.0;
        }
        for (slot, n) in slots.iter().zip(equal_finish(&lines, held)) {
            next[*slot] = n / total;
        }
        return normalized(&next);
    }
    let known = taking(&known, &taking_part);
    if known.len() < 2 {
        return weights.to_vec();
    }
    let rows: Vec<f64> = known
        .iter()
        .map(|&(slot, _)| weights[slot] * total)
        .collect();
    let slowest = |rows: &[f64]| {
        (known.iter().zip(rows))
            .map(|((_, line), &n)| line.at(n))
            .fold(0.0, f64::max)
    };
    let known_lines: Vec<Line> = known.iter().map(|&(_, line)| line).collect();
    let target = equal_finish(&known_lines, held);
    // The whole move shortened so that no shard more than doubles or halves.
    let mut reach: f64 = 1.0;
    for (&to, &from) in target.iter().zip(&rows) {
        if to > 2.0 * from {
            reach = reach.min(from / (to - from));
        } else if to < 0.5 * from {
            reach = reach.min(0.5 * from / (from - to));
        }
    }
    let moved: Vec<f64> = (target.iter().zip(&rows))
        .map(|(&to, &from)| from + reach * (to - from))
        .collect();
    // A move the lines say saves less than `tolerance` of the slowest finish is not made:
    // a device late by a cost no split removes (its inputs arriving) keeps its rows.
    let (now, then) = (slowest(&rows), slowest(&moved));
    if now - then <= tolerance * now {
        return weights.to_vec();
    }
    let mut next = weights.to_vec();
    for (&(slot, _), n) in known.iter().zip(moved) {
        next[slot] = n / total;
    }
    normalized(&next)
}

/// The slots of `known` that `part` marks.
fn taking(known: &[(usize, Line)], part: &[bool]) -> Vec<(usize, Line)> {
    (known.iter().zip(part))
        .filter(|(_, part)| **part)
        .map(|(known, _)| *known)
        .collect()
}

/// Which of the `known` slots take part in the next step, from those that do (`part`): one
/// slot left out or brought back at a time, the change that most shortens the predicted
/// finish of `held` rows, while it shortens it by more than `tolerance` of it. At least one
/// slot takes part.
fn slots_taking_part(
    known: &[(usize, Line)],
    moves: &[f64],
    held: f64,
    tolerance: f64,
    mut part: Vec<bool>,
) -> Vec<bool> {
    let finish = |part: &[bool]| {
        let (slots, lines): (Vec<usize>, Vec<Line>) = taking(known, part).into_iter().unzip();
        let serial: f64 = slots
            .iter()
            .map(|&slot| moves.get(slot).copied().unwrap_or(0.0))
            .sum();
        let rows = equal_finish(&lines, held);
        let slowest = (lines.iter().zip(rows))
            .map(|(line, n)| line.at(n))
            .fold(0.0, f64::max);
        serial + slowest
    };
    loop {
        let now = finish(&part);
        let best = (0..part.len())
            .filter(|&i| !part[i] || part.iter().filter(|p| **p).count() > 1)
            .map(|i| {
                let mut changed = part.clone();
                changed[i] = !changed[i];
                (finish(&changed), changed)
            })
            .min_by(|a, b| a.0.total_cmp(&b.0));
        match best {
            Some((then, changed)) if now - then > tolerance * now => part = changed,
            _ => return part,
        }
    }
}

/// `weights` scaled to sum to one.
pub(super) fn normalized(weights: &[f64]) -> Vec<f64> {
    let total: f64 = weights.iter().sum();
    weights.iter().map(|w| w / total).collect()
}
