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

    /// Log filter in `RUST_LOG` syntax, e.g. `info` or `topodra_driver=debug`.
    #[arg(long, global = true, env = "TOPODRA_LOG", default_value = "info")]
    log_level: String,
}

/// A `--log-level` that is not a filter.
#[derive(Debug, thiserror::Error)]
#[error("invalid --log-level {filter:?}: {source}")]
pub struct LogLevelError {
    filter: String,
    source: tracing_subscriber::filter::ParseError,
}

/// Installs the global subscriber; call once, first thing in `main`.
pub fn init(args: &LoggingArgs) -> Result<(), LogLevelError> {
    let filter = EnvFilter::try_new(&args.log_level).map_err(|source| LogLevelError {
        filter: args.log_level.clone(),
        source,
    })?;
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
