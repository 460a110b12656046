//! Fault injection for the crash tests, only in builds with the `crash-points`
//! feature: a release binary has neither the flag nor the hook.

use clap::Args;

#[cfg(feature = "crash-points")]
#[derive(Debug, Args)]
pub(crate) struct CrashArgs {
    /// Abort the process at this point of every prepare.
    #[arg(long, env = "TOPODRA_TEST_CRASH_AT", hide = true)]
    pub(crate) test_crash_at: Option<String>,
}

#[cfg(not(feature = "crash-points"))]
#[derive(Debug, Args)]
pub(crate) struct CrashArgs {}

/// Installs the hook that aborts the process at `--test-crash-at`, as a kill would.
#[cfg(feature = "crash-points")]
pub(crate) fn with_test_crash_at(
    mut preparer: topodra_node::prepare::Preparer,
    args: &CrashArgs,
) -> anyhow::Result<topodra_node::prepare::Preparer> {
    use topodra_node::prepare::CrashPoint;
    if let Some(point) = &args.test_crash_at {
        let point: CrashPoint = point.parse().map_err(anyhow::Error::msg)?;
        tracing::warn!(
            ?point,
            "fault injection: the process aborts there in every prepare"
        );
        preparer = preparer.with_crash_hook(std::sync::Arc::new(move |at| {
            if at == point {
                std::process::abort();
            }
            false
        }));
    }
    Ok(preparer)
}
