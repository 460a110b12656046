//! Structured logs on stderr, as text for people or JSON for log pipelines.

use std::io::IsTerminal;

use clap::{Args, ValueEnum};
use tracing_subscriber::EnvFilter;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Args)]
pub struct LoggingArgs {
    /// Log format.
    #[arg(
        long,
        global = true,
        env = "TOPODRA_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    log_format: LogFormat,

    /// Log filter: a level (off, error, warn, info, debug, trace), optionally with
    /// `target=level` directives in `RUST_LOG` syntax, e.g. `info,topodra_node=debug`.
    #[arg(long, global = true, env = "TOPODRA_LOG", default_value = "info")]
    log_level: String,
}

/// A `--log-level` that is not a filter, or one that would silence what it does not
/// name.
#[derive(Debug, thiserror::Error)]
#[error("invalid --log-level {filter:?}: {reason}")]
pub struct LogLevelError {
    filter: String,
    reason: String,
}

/// The levels a directive may name, in `RUST_LOG` order.
const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// Parses `--log-level` into a filter.
///
/// `RUST_LOG` syntax reads a bare word that is not a level as a target: `verbose`
/// enables every level of a module named `verbose`, which does not exist, and
/// silences every other line, warnings and errors included. Nobody means that, and a
/// plugin that logs nothing hides every problem, so a directive without `=` must be
/// a level (`info`), and targets are written with theirs (`topodra_node=debug`).
pub fn filter(directives: &str) -> Result<EnvFilter, LogLevelError> {
    let refuse = |reason: String| LogLevelError {
        filter: directives.to_owned(),
        reason,
    };
    if directives.trim().is_empty() {
        return Err(refuse(format!(
            "empty; use a level ({}), optionally with target=level directives",
            LEVELS.join(", ")
        )));
    }
    for directive in directives.split(',').map(str::trim) {
        if !directive.is_empty()
            && !directive.contains('=')
            && !LEVELS.iter().any(|l| l.eq_ignore_ascii_case(directive))
        {
            return Err(refuse(format!(
                "{directive:?} is not a level ({}); name a target with its level, e.g. \
                 {directive}=debug, or it would silence every other log line",
                LEVELS.join(", ")
            )));
        }
    }
    EnvFilter::try_new(directives).map_err(|e| refuse(e.to_string()))
}

/// Installs the global subscriber; call once, first thing in `main`.
pub fn init(args: &LoggingArgs) -> Result<(), LogLevelError> {
    let filter = filter(&args.log_level)?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match args.log_format {
        LogFormat::Text => builder.with_target(false).init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_and_target_directives_are_filters() {
        for ok in [
            "info",
            "WARN",
            "debug,kube=warn",
            "info,topodra_node=debug,topodra_kubelet_plugin::publish=trace",
            "off",
            "info,",
        ] {
            assert!(filter(ok).is_ok(), "{ok}: {:?}", filter(ok).err());
        }
    }

    #[test]
    fn words_that_would_silence_everything_are_refused() {
        for (bad, says) in [
            ("verbose", "\"verbose\" is not a level"),
            ("info,verbose", "\"verbose\" is not a level"),
            ("topodra_node", "topodra_node=debug"),
            ("", "empty"),
            ("  ", "empty"),
        ] {
            let e = filter(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad:?}: {e}");
            assert!(e.starts_with("invalid --log-level"), "{e}");
        }
    }

    #[test]
    fn a_target_with_an_unknown_level_is_refused() {
        let e = filter("topodra_node=verbose").unwrap_err().to_string();
        assert!(e.contains("topodra_node=verbose"), "{e}");
    }
}
