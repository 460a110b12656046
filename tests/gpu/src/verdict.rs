//! One verdict per step: printed as it is reached (a run cut short by the device's
//! time limit still shows how far it got) and written to `verdicts.json`.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub(crate) enum Outcome {
    Pass,
    Fail,
    /// Only in a dry run, for a fact the simulated node cannot give.
    Skip,
}

#[derive(Debug, Serialize)]
pub(crate) struct Verdict {
    pub(crate) step: String,
    pub(crate) outcome: Outcome,
    pub(crate) detail: String,
}

/// The verdicts of one subcommand, and the folder its files go to.
#[derive(Debug)]
pub(crate) struct Report {
    out: PathBuf,
    name: &'static str,
    dry_run: bool,
    verdicts: Vec<Verdict>,
}

impl Report {
    pub(crate) fn new(out: &Path, name: &'static str, dry_run: bool) -> anyhow::Result<Self> {
        std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
        Ok(Self {
            out: out.to_owned(),
            name,
            dry_run,
            verdicts: Vec::new(),
        })
    }

    pub(crate) fn dry_run(&self) -> bool {
        self.dry_run
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.out.join(name)
    }

    /// Writes `name` into the results folder; a failure to write is the check's own.
    pub(crate) fn save(&self, name: &str, bytes: impl AsRef<[u8]>) -> anyhow::Result<()> {
        let path = self.path(name);
        std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))
    }

    pub(crate) fn save_json(&self, name: &str, value: &impl Serialize) -> anyhow::Result<()> {
        self.save(name, serde_json::to_vec_pretty(value)?)
    }

    pub(crate) fn record(&mut self, step: &str, outcome: Outcome, detail: impl Into<String>) {
        let detail = detail.into();
        let word = match outcome {
            Outcome::Pass => "PASS",
            Outcome::Fail => "FAIL",
            Outcome::Skip => "SKIP",
        };
        println!("gpu-check: {step}: {word} {detail}");
        self.verdicts.push(Verdict {
            step: step.to_owned(),
            outcome,
            detail,
        });
    }

    /// PASS when `ok`, else FAIL.
    pub(crate) fn check(&mut self, step: &str, ok: bool, detail: impl Into<String>) -> bool {
        self.record(step, if ok { Outcome::Pass } else { Outcome::Fail }, detail);
        ok
    }

    /// A fact only a real GPU gives: checked on one, SKIP in a dry run with `why`.
    pub(crate) fn check_real(
        &mut self,
        step: &str,
        ok: bool,
        detail: impl Into<String>,
        why: &str,
    ) -> bool {
        if self.dry_run {
            self.record(
                step,
                Outcome::Skip,
                format!("{why}; seen: {}", detail.into()),
            );
            true
        } else {
            self.check(step, ok, detail)
        }
    }

    /// Writes `<name>-verdicts.json`; true when nothing failed.
    pub(crate) fn finish(self) -> anyhow::Result<bool> {
        let passed = self.verdicts.iter().all(|v| v.outcome != Outcome::Fail);
        self.save_json(&format!("{}-verdicts.json", self.name), &self.verdicts)?;
        Ok(passed)
    }
}
