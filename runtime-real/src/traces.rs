//! `tessera trace summary` and `tessera replay node`: reading the traces servers write
//! with `--trace-dir`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use tessera_core::trace::{self, replay};

/// Prints the summary of the traces under `paths`. Exits 2 if one cannot be read.
pub fn summary(paths: &[PathBuf], json: bool) -> ExitCode {
    let nodes = match tessera_tracefile::read_paths(paths) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("tessera: {e}");
            return ExitCode::from(2);
        }
    };
    let s = tessera_tracefile::summary::summary(&nodes);
    if json {
        println!("{}", s.json());
    } else {
        print!("{}", s.table());
    }
    ExitCode::SUCCESS
}

/// Replays the node whose trace is in `dir`: 0 if it did what the trace says, 1 at the
/// first divergence, 2 if the trace cannot be read, 3 if nothing in it could be replayed
/// (a chunkserver's trace, or a master's whose start records were all removed).
pub fn replay_node(dir: &Path) -> ExitCode {
    let files = match tessera_tracefile::read_node(dir) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("tessera: {e}");
            return ExitCode::from(2);
        }
    };
    let report = replay::replay(&files);
    let text = replay_text(&report);
    match report.divergence {
        None if report.runs == 0 => {
            print!("{text}");
            println!("nothing was replayed: no run of a master starts in this trace");
            ExitCode::from(3)
        }
        None => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Some(_) => {
            print!("{text}");
            ExitCode::from(1)
        }
    }
}

/// What a replay found, as printed.
pub fn replay_text(r: &replay::Report) -> String {
    let mut o = String::new();
    for n in &r.notes {
        o += &format!("note: {n}\n");
    }
    o += &format!(
        "replayed {} runs, {} steps{}{}\n",
        r.runs,
        r.steps,
        if r.unreplayed_runs > 0 {
            format!(
                "; {} chunkserver runs ({} steps) read but not replayed: a chunkserver's \
                 trace keeps file data as length and CRC only",
                r.unreplayed_runs, r.unreplayed_steps
            )
        } else {
            String::new()
        },
        if r.skipped > 0 {
            format!(
                "; {} records before the first start record skipped (their run began in a \
                 file since removed)",
                r.skipped
            )
        } else {
            String::new()
        },
    );
    match &r.divergence {
        None if r.runs > 0 => o += "no divergence: every step replayed had its recorded effects\n",
        None => {}
        Some(d) => {
            o += &format!(
                "DIVERGENCE at {}: {}\n  differs: {}\n  recorded: {}\n  replayed: {}\n  the record: {:?}\n",
                d.file,
                trace::describe(&d.record),
                d.what,
                d.expected,
                d.actual,
                d.record
            );
            o += &format!("the {} records before it:\n", d.before.len());
            for b in &d.before {
                o += &format!("  {}\n", trace::describe(b));
            }
        }
    }
    o
}
