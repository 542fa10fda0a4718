//! A warm start (`--init-model DIR`, PaddleRec's `init_model_path`): a new job that begins
//! with a saved model's parameters and optimizer state, as online training after a model
//! trained offline on the history does. Unlike `--resume` it is a job of its own: its passes
//! are numbered from 1, an online calendar starts at its own first day, and it saves into its
//! own output. The servers load the model as for a resume (any number of servers: see
//! [`crate::persist::checkpoint::Manifest::load_resharded`]); this module checks that the job
//! means by the saved numbers what the job that saved them meant ([`StartModel`]: the same tables
//! and optimizers), and that it scales its dense inputs as that model did, taking its statistics
//! ([`scaling`], pure and unit-tested). A resumed job is held to the same scaling.

use std::path::{Path, PathBuf};

use crate::data::read::transform::{DenseStats, DenseTransform, StatsSource};
use crate::data::DataConfig;
use crate::persist::checkpoint::Manifest;
use crate::table::TableSpec;

/// The saved model a job starts from: a warm start's (`--init-model`) or a resume's.
pub struct StartModel {
    /// Its manifest.
    pub manifest: Manifest,
    /// The pass folder holding it.
    pub pass_dir: PathBuf,
    /// The flag that named it, for messages.
    flag: &'static str,
    /// The SHA-256 of its manifest.
    digest: String,
}

impl StartModel {
    /// The model a job configured with `resume` and `init_model` starts from, if any: its
    /// manifest read (from a pass folder, or an output folder whose `latest` names one).
    pub fn open(resume: Option<&Path>, init_model: Option<&Path>) -> anyhow::Result<Option<StartModel>> {
        let (dir, flag) = match (resume, init_model) {
            (Some(_), Some(_)) => anyhow::bail!(
                "--resume and --init-model both name a model to start from: give one (--resume goes on from a save, \
                 --init-model starts a new job from it)"
            ),
            (Some(dir), None) => (dir, "--resume"),
            (None, Some(dir)) => (dir, "--init-model"),
            (None, None) => return Ok(None),
        };
        anyhow::ensure!(!dir.is_file(), "{flag} {}: a file, not a saved model's folder", dir.display());
        let (manifest, pass_dir) = Manifest::find(dir).map_err(|e| anyhow::anyhow!("{flag}: {e}"))?;
        let digest = crate::persist::checkpoint::digest(&pass_dir).map_err(|e| anyhow::anyhow!("{flag}: {e}"))?;
        Ok(Some(StartModel { manifest, pass_dir, flag, digest }))
    }

    /// What a trainer declares to the servers of the model it starts from, which each server
    /// compares with the one it loaded (`start_model` in the declared description): servers
    /// started without the model, or with another, would have trained a fresh one without a word.
    pub fn record(&self) -> serde_json::Value {
        serde_json::json!({
            "flag": self.flag,
            "path": self.pass_dir.display().to_string(),
            "pass": self.manifest.pass,
            "manifest_sha256": self.digest,
        })
    }

    /// Checks that the saved model has this job's tables: shapes and optimizers.
    pub fn check_spec(&self, spec: &TableSpec) -> anyhow::Result<()> {
        anyhow::ensure!(
            &self.manifest.spec == spec,
            "{} {}: the saved model's tables differ from this job's (model shape or optimizer changed)",
            self.flag,
            self.pass_dir.display()
        );
        Ok(())
    }

    /// This job's `[data]` when it starts from this model: see [`scaling`].
    pub fn data(&self, job: &DataConfig) -> anyhow::Result<DataConfig> {
        // Read in place: a copy of a manifest's huge statistics aborted the process.
        let saved = match self.manifest.model.get("data") {
            Some(v) => Some(<DataConfig as serde::Deserialize>::deserialize(v).map_err(|e| {
                anyhow::anyhow!("{} {}: the manifest's [data]: {e}", self.flag, self.pass_dir.display())
            })?),
            None => None,
        };
        scaling(job, saved.as_ref()).map_err(|e| anyhow::anyhow!("{} {}: {e}", self.flag, self.pass_dir.display()))
    }
}

/// What a job's saves name as the model it was warm-started from (`init_model` in their
/// manifests): its own `--init-model`, or on a resume the one the resumed save names (as a
/// path), so a resume does not drop the lineage.
pub fn lineage(init_model: Option<&Path>, from: Option<&StartModel>) -> Option<String> {
    match init_model {
        Some(dir) => Some(std::path::absolute(dir).unwrap_or(dir.to_path_buf()).display().to_string()),
        None => from?.manifest.model.get("init_model")?.as_str().map(str::to_string),
    }
}

/// The transform a `[data]` applies (`None` and an absent one alike).
fn transform(data: &DataConfig) -> DenseTransform {
    data.dense_transform.unwrap_or_default()
}

/// The statistics a `[data]` holds (a saved model's and a resolved job's are inline).
fn stats(data: &DataConfig) -> Option<&DenseStats> {
    match &data.dense_stats {
        Some(StatsSource::Inline(s)) => Some(s),
        _ => None,
    }
}

/// The job's `[data]` for a start (warm or resumed) from a model saved with `saved` (`None`: a
/// manifest that records none). The weights were learned on inputs scaled the saved model's way, so the job
/// must scale them the same: the same transform, and the saved statistics, which the job takes
/// when it gives none (it does not compute its own over its files, which would differ) and
/// which it may not contradict.
pub fn scaling(job: &DataConfig, saved: Option<&DataConfig>) -> Result<DataConfig, String> {
    let (mine, theirs) = (transform(job), saved.map(transform));
    let Some(theirs) = theirs else {
        return match mine {
            DenseTransform::None => Ok(job.clone()),
            _ => Err(format!(
                "the saved model does not record how it scaled its dense values, and this job scales them \
                 ({mine:?}): the weights could mean other inputs"
            )),
        };
    };
    if mine != theirs {
        return Err(format!(
            "the saved model read its dense values with dense_transform {theirs:?}, this job with {mine:?}: its \
             weights were learned on the first; give the same"
        ));
    }
    if mine == DenseTransform::None {
        return Ok(job.clone());
    }
    let saved_stats =
        saved.and_then(stats).ok_or("the saved model scales its dense values but records no statistics")?;
    match stats(job) {
        None => Ok(DataConfig { dense_stats: Some(StatsSource::Inline(saved_stats.clone())), ..job.clone() }),
        Some(given) => match first_difference(given, saved_stats) {
            None => Ok(job.clone()),
            Some(what) => Err(format!(
                "this job's dense_stats differ from the saved model's ({what}): drop them from [data] and the job \
                 takes the saved model's"
            )),
        },
    }
}

/// The first statistic where `a` and `b` differ, named (`mean[3] 1.5 against 2`).
fn first_difference(a: &DenseStats, b: &DenseStats) -> Option<String> {
    let named = [("mean", &a.mean, &b.mean), ("std", &a.std, &b.std), ("min", &a.min, &b.min), ("max", &a.max, &b.max)];
    for (name, x, y) in named {
        if x.len() != y.len() {
            return Some(format!("{} {name} values against {}", x.len(), y.len()));
        }
        if let Some((i, (p, q))) = x.iter().zip(y).enumerate().find(|(_, (p, q))| p.to_bits() != q.to_bits()) {
            return Some(format!("{name}[{i}] {p} against {q}"));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(t: Option<DenseTransform>, s: Option<DenseStats>) -> DataConfig {
        DataConfig { dense_transform: t, dense_stats: s.map(StatsSource::Inline), ..DataConfig::default() }
    }

    fn numbers(mean: f64) -> DenseStats {
        DenseStats { count: 10, mean: vec![mean, 1.0], std: vec![2.0, 1.0], min: vec![0.0, 0.0], max: vec![9.0, 2.0] }
    }

    #[test]
    fn a_start_from_a_saved_model_scales_its_inputs_as_that_model_did() {
        let std = Some(DenseTransform::Standardize);
        let saved = data(std, Some(numbers(3.0)));
        // Given none, the job takes the saved statistics rather than computing its own.
        let taken = scaling(&data(std, None), Some(&saved)).unwrap();
        assert_eq!(stats(&taken), Some(&numbers(3.0)));
        // The same given: kept; another count alone does not change a scaling.
        assert!(scaling(&data(std, Some(DenseStats { count: 99, ..numbers(3.0) })), Some(&saved)).is_ok());
        // Others: refused, naming the first that differs.
        let err = scaling(&data(std, Some(numbers(3.5))), Some(&saved)).unwrap_err();
        assert!(err.contains("mean[0] 3.5 against 3"), "{err}");
        // Another transform, or scaling where the saved model did not: refused by name.
        let err = scaling(&data(Some(DenseTransform::Minmax), None), Some(&saved)).unwrap_err();
        assert!(err.contains("Standardize") && err.contains("Minmax"), "{err}");
        let err = scaling(&data(std, None), Some(&data(None, None))).unwrap_err();
        assert!(err.contains("None") && err.contains("Standardize"), "{err}");
        assert!(scaling(&data(std, None), None).unwrap_err().contains("does not record"));
        // Neither scales: as given (an absent transform is none).
        assert!(scaling(&data(None, None), Some(&data(Some(DenseTransform::None), None))).is_ok());
        assert!(scaling(&data(None, None), None).is_ok());
    }
}
