//! The commands over a saved model: `predict`, `eval`, `export` and `serve`.

use anyhow::Context;

use super::args::*;
use super::report::*;
use crate::data::resolve_files;
use crate::model::Registry;

/// `oar predict`: a saved model's scores for data files, one line per sample.
pub(super) fn predict(a: PredictArgs, registry: &Registry) -> anyhow::Result<()> {
    let saved = crate::serve::predict::load(&a.model, registry)?;
    crate::serve::predict::check_pipe_command(&saved.schema, &a.model, a.trust_pipe_command)?;
    let files = a.data.iter().map(|d| resolve_files(d)).collect::<Result<Vec<_>, _>>()?.concat();
    let inputs: Vec<&std::path::Path> = files.iter().map(|f| f.as_path()).collect();
    let to_stdout = a.out.as_os_str() == "-";
    if !to_stdout {
        // Its folder, not the file: a name inside the saved model is refused even before it exists.
        let folder = a.out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
        anyhow::ensure!(
            !crate::base::state_file::is_within(folder, &a.model),
            "--out {} is inside the saved model {}: scores written there could replace its files; name a file \
             elsewhere",
            a.out.display(),
            a.model.display()
        );
        crate::base::state_file::check_output(&a.out, &inputs)?;
    }
    let bar = files_bar(&files);
    if a.no_progress {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    // Written beside the destination and renamed into place: a failed run leaves no
    // half file behind.
    let tmp = a.out.with_file_name(format!(
        ".{}.{}.tmp",
        a.out.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default(),
        std::process::id()
    ));
    let config = crate::serve::predict::PredictConfig {
        files,
        batch_size: a.batch_size,
        threads: a.threads,
        skip_bad_lines: a.skip_bad_lines,
    };
    let run = || -> anyhow::Result<crate::serve::predict::PredictReport> {
        if to_stdout {
            let mut out = std::io::BufWriter::with_capacity(1 << 20, std::io::stdout().lock());
            return crate::serve::predict::predict(&saved, &config, &mut out, &|bytes| bar.set_position(bytes));
        }
        let file = crate::base::state_file::create_new(&tmp, 0o644)?;
        let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
        let r = crate::serve::predict::predict(&saved, &config, &mut out, &|bytes| bar.set_position(bytes))?;
        drop(out);
        std::fs::rename(&tmp, &a.out).with_context(|| format!("cannot write {}", a.out.display()))?;
        Ok(r)
    };
    let r = run().inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })?;
    bar.finish_and_clear();
    let heads = saved.model.head_names().join(", ");
    let said = format!(
        "model pass {}: {} lines of scores ({heads}) written to {}{}",
        saved.manifest.pass,
        r.samples,
        if to_stdout { "standard output".into() } else { a.out.display().to_string() },
        if r.bad_lines > 0 { format!("; {} bad lines skipped", r.bad_lines) } else { String::new() }
    );
    // The scores went to standard output: what is said of them goes beside it.
    if to_stdout {
        eprintln!("{said}");
    } else {
        println!("{said}");
    }
    Ok(())
}

/// `oar export`: a saved model as ONNX and tables.
pub(super) fn export(a: ExportArgs, registry: &Registry) -> anyhow::Result<()> {
    let saved = crate::serve::predict::load(&a.model, registry)?;
    let config = crate::serve::model_export::ExportConfig { out: a.out.clone(), complete_limit: a.complete_limit };
    let m = crate::serve::model_export::export(&saved, &a.model, &config)?;
    let rows: u64 = m.tables.iter().map(|t| t.rows).sum();
    let complete = match &m.model_skipped {
        None => "model.onnx, ".to_string(),
        Some(why) => format!("(no model.onnx: {why}) "),
    };
    println!(
            "model pass {}: exported to {}: dense.onnx, {complete}tables.safetensors ({rows} rows in {} tables), manifest.json",
            m.pass,
            a.out.display(),
            m.tables.len()
        );
    Ok(())
}

/// `oar eval`: a saved model's metrics on data files.
pub(super) fn eval(a: EvalArgs, registry: &Registry) -> anyhow::Result<()> {
    let files = a.data.iter().map(|d| resolve_files(d)).collect::<Result<Vec<_>, _>>()?.concat();
    let crate::serve::predict::Saved { manifest, model, schema, shard, .. } =
        crate::serve::predict::load(&a.model, registry)?;
    crate::serve::predict::check_pipe_command(&schema, &a.model, a.trust_pipe_command)?;
    let mut store = crate::train::Store::local(shard);
    let heads = crate::train::evaluate_heads(&mut store, &model, &schema, &files, a.batch_size, a.skip_bad_lines)?;
    println!("model pass {}: {} samples, {}", manifest.pass, heads[0].samples, heads[0]);
    if heads.len() > 1 {
        for (name, r) in model.head_names().iter().zip(&heads) {
            println!("  head {name}: {r}");
        }
    }
    Ok(())
}

/// `oar serve`: a saved model over KServe v2, reloaded when a newer pass is saved.
pub(super) fn serve(a: ServeArgs, registry: &Registry) -> anyhow::Result<()> {
    crate::serve::run(
        &crate::serve::ServeConfig {
            model: a.model.clone(),
            addr: a.addr.clone(),
            name: a.name.clone(),
            poll: std::time::Duration::from_millis(a.poll_ms.max(1)),
            limits: super::limits::serve_limits(&a)?,
        },
        registry,
    )
}
