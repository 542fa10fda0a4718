//! What the command line prints: a generated data set, a launch's summary, and a server's
//! counters when it stops (its log lines, and `OAR_RESULT` for launchers).

use std::time::Instant;

use super::args::GenArgs;

pub(super) fn print_generated(a: &GenArgs, r: &crate::data::gen::GenReport, started: Instant) {
    println!(
        "generated {} train lines in {} part(s) + {} test lines into {} in {:.1} s; train CTR {:.4}; oracle test AUC {}",
        r.train_lines,
        r.parts,
        r.test_lines,
        a.out.display(),
        started.elapsed().as_secs_f64(),
        r.train_ctr,
        // No AUC without test lines of both labels.
        r.oracle_test_auc.map_or("-".to_string(), |auc| format!("{auc:.4}"))
    );
}

/// The end-of-job lines both launchers print.
pub(super) fn print_summary(label: &str, s: &crate::run::launch::LaunchSummary) {
    println!(
        "{label}: {} servers x {} workers, {} samples in {:.1} s: {:.0} samples/s end to end, {:.0} in the training loops",
        s.servers, s.workers, s.samples, s.wall_seconds, s.samples_per_sec, s.train_loop_samples_per_sec
    );
    if let Some(a) = &s.train_auc_all_trainers {
        println!(
            "last pass's training figures over all {} trainers' {} samples (Paddle's buckets): {a}",
            a.trainers.len(),
            a.samples
        );
    }
    if let Some(t) = &s.test {
        println!("test {t}");
    }
    for h in &s.heads {
        if let Some(t) = &h.test {
            println!("  head {}: test {t}", h.output);
        }
    }
    print_days(&s.days);
    if s.staleness.count() > 0 {
        println!("push staleness (updates between a trainer's pull and the server applying its push): {}", s.staleness);
    }
    if s.discarded_pushes > 0 {
        println!("{} stale pushes discarded", s.discarded_pushes);
    }
    let (sent, received) =
        s.server_stats.iter().fold((0, 0), |(i, o), x| (i + x.frame_bytes_in, o + x.frame_bytes_out));
    if s.samples > 0 && sent + received > 0 {
        println!(
            "network: {:.0} bytes per sample to the servers, {:.0} from them (frames, counted by the servers)",
            sent as f64 / s.samples as f64,
            received as f64 / s.samples as f64
        );
    }
    let bad: u64 = s.reports.iter().map(|r| r.bad_lines).sum();
    if bad > 0 {
        let per: Vec<String> = s.reports.iter().map(|r| r.bad_lines.to_string()).collect();
        println!("{bad} bad line(s) skipped (--skip-bad-lines), per trainer: {}", per.join(", "));
    }
    if let Some(png) = &s.curves {
        println!("training curves: {} (from the trainers' metrics.csv beside it)", png.display());
    }
    for r in &s.restarts {
        let from = r.from.as_ref().map(|f| format!(", from {f}")).unwrap_or_default();
        println!("restarted {} ({}) at {:.1} s, restart {}{from}", r.process, r.cause, r.at_seconds, r.epoch);
    }
}

/// Online training's days: the AUCs, what the shrink deleted, rows and memory per server.
pub(super) fn print_days(days: &[crate::train::DayReport]) {
    if days.is_empty() {
        return;
    }
    println!("day       train AUC  next-day AUC  shrunk rows  rows per server  peak MiB per server");
    let auc = |a: Option<f64>| a.map_or("-".to_string(), |x| format!("{x:.4}"));
    for d in days {
        let mib: Vec<String> =
            d.peak_rss_bytes.iter().map(|b| format!("{:.0}", *b as f64 / (1 << 20) as f64)).collect();
        println!(
            "{}  {:>9}  {:>12}  {:>11}  {:>15}  {}",
            d.date,
            auc(d.train_auc),
            auc(d.next_day.as_ref().and_then(|e| e.auc)),
            d.shrunk_rows,
            d.rows.iter().map(u64::to_string).collect::<Vec<_>>().join(","),
            mib.join(",")
        );
    }
}

/// The server's counters on stdout (`OAR_RESULT <json>`), for launchers' summaries.
pub(super) fn report_stopped(stats: &crate::protocol::ServerStats) -> anyhow::Result<()> {
    use std::io::Write;
    println!("OAR_RESULT {}", serde_json::to_string(stats)?);
    std::io::stdout().flush()?;
    Ok(())
}

/// The server's last log lines: its counters, and how stale async pushes arrived.
pub(super) fn log_stopped(stats: &crate::protocol::ServerStats) {
    if stats.staleness.count() > 0 {
        tracing::info!("push staleness: {}", stats.staleness);
    }
    tracing::info!(?stats, "server stopped");
}

/// A progress bar over the bytes of `files`.
pub(super) fn files_bar(files: &[std::path::PathBuf]) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(crate::data::read::files::total_bytes(files));
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} ({bytes_per_sec}, {eta})")
            .expect("valid template"),
    );
    bar
}
