//! The strategies bench's rounds in processes of their own: how a child is started and how
//! it reports its round (`STRATEGIES_CHILD`, a `STRATEGIES_RESULT` line on stdout).

use std::time::Duration;

use crate::strategy_runs::Strategy;

/// One round of `strategy` over `replicas` devices: each step's time, the
/// calling thread's CPU per step, the most device memory in use after a forward.
pub type Round = (Vec<Duration>, Option<Duration>, Option<u64>);

/// The line a child process prints its round on.
pub const RESULT: &str = "STRATEGIES_RESULT";

/// One round in a process of its own (this bench, with `STRATEGIES_CHILD`): a device fault
/// there fails this round alone. Its stderr passes through; a failure is its exit status and
/// its first panic's message (or the last line it wrote).
pub fn child_round(model: &str, strategy: Strategy, replicas: usize) -> Result<Round, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let child = std::process::Command::new(exe)
        .args(std::env::args().skip(1))
        .env(
            "STRATEGIES_CHILD",
            format!("{model}:{}:{replicas}", strategy.key()),
        )
        .stderr(std::process::Stdio::piped())
        .output()
        .map_err(|e| format!("could not start: {e}"))?;
    let stderr = String::from_utf8_lossy(&child.stderr);
    eprint!("{stderr}");
    let stdout = String::from_utf8_lossy(&child.stdout);
    let line = stdout.lines().find_map(|l| l.strip_prefix(RESULT));
    match (child.status.success(), line) {
        (true, Some(line)) => parse_round(line.trim()).ok_or_else(|| format!("unreadable: {line}")),
        _ => {
            // The first panic's message (the line after "panicked at"), else the last line.
            let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
            let panic = lines.iter().position(|l| l.contains("panicked at"));
            let reason = match panic {
                Some(at) => lines.get(at + 1).copied().unwrap_or(lines[at]),
                None => lines.last().copied().unwrap_or(""),
            };
            Err(format!("{} ({})", child.status, reason.trim()))
        }
    }
}

/// A round as a child prints it: step times in microseconds, the CPU per step, the memory.
pub fn format_round((times, cpu, memory): &Round) -> String {
    let times: Vec<String> = times.iter().map(|t| t.as_micros().to_string()).collect();
    let optional = |v: Option<u128>| v.map_or("-".into(), |v| v.to_string());
    format!(
        "{} {} {}",
        times.join(","),
        optional(cpu.map(|c| c.as_micros())),
        optional(memory.map(u128::from))
    )
}

fn parse_round(line: &str) -> Option<Round> {
    let mut fields = line.split(' ');
    let times = (fields.next()?.split(','))
        .map(|t| t.parse().ok().map(Duration::from_micros))
        .collect::<Option<Vec<_>>>()?;
    let optional = |field: &str| field.parse::<u64>().ok();
    let cpu = optional(fields.next()?).map(Duration::from_micros);
    let memory = optional(fields.next()?);
    Some((times, cpu, memory))
}
