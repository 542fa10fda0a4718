//! A trainer's job as phases, each with the state it needs in [`Job`]: what the job starts from
//! ([`with_stats`], [`Job::start`]: its checks, the store, its position, the metrics endpoint and
//! the curves), each pass ([`Job::train_pass`]), a pass's end ([`Job::end_of_pass`]: its figures,
//! the AUC over all trainers, then `meet_and_save`), and the finish ([`Job::finish`]).
//! [`super::run_with`] drives them.
//!
//! `meet_and_save` is the pass's end all trainers share: a barrier; trainer 0's part (at a day's
//! end the shrink, then the save for serving that is due, the pass's save, the test set's and the
//! next day's figures); a barrier. The save for serving comes before the pass's save: a crash
//! between them redoes the pass, saves again and announces the save once, where the other order
//! could leave a pass without its line in the done-file.

use std::borrow::Cow;

use super::init_model::StartModel;
use super::*;

/// The configuration a job runs with: dense statistics not given are taken from the saved model
/// it starts from (resumed or warm), or, offline, computed over all its training files (as `oar
/// train` does) and saved with the model. Returns it with the saved model, if any.
pub(super) fn with_stats(config: &TrainConfig) -> anyhow::Result<(Cow<'_, TrainConfig>, Option<StartModel>)> {
    let from = StartModel::open(config.resume.as_deref(), config.init_model.as_deref())?;
    let stats = match (&from, &config.online) {
        (Some(from), _) => Some(from.data(&config.data)?),
        (None, None) => {
            crate::data::read::transform::fill_stats(&config.data, &config.train_files, config.model.shorthand_shape())?
        }
        (None, Some(_)) => None,
    };
    let config = match stats {
        Some(data) => Cow::Owned(TrainConfig { data, ..config.clone() }),
        None => Cow::Borrowed(config),
    };
    Ok((config, from))
}

/// The job's model, its data schema and its tables, checked before anything is opened: the
/// configuration, the model's memory and delay, the tables, the done-file trainer 0 appends to
/// (before training, not after the first day), the online shares, and the spec of the saved
/// model it starts `from`.
fn checked(
    config: &TrainConfig,
    registry: &Registry,
    from: Option<&StartModel>,
) -> anyhow::Result<(Model, Schema, TableSpec)> {
    config.validate()?;
    if let Err(why) = config.precision.check_cpu() {
        tracing::warn!("{why}");
    }
    let (model, schema) = crate::train::job_config::build_model(&config.model, &config.data, registry)?;
    model.check_memory(config.batch_size, config.threads).map_err(anyhow::Error::msg)?;
    model.check_delay(config.delay).map_err(anyhow::Error::msg)?;
    let spec = model.table_spec(config.dense_optimizer, config.sparse_optimizer);
    spec.validate().map_err(anyhow::Error::msg)?;
    anyhow::ensure!(
        spec.sum_rules().0 == 0,
        "a table's optimizer is sum, the rule GEO's servers run (--mode geo sets it); name the rule the trainers run"
    );
    // What the servers hold, and the saves record: in a GEO job the rule `sum` (the job's rules
    // run on the trainers' copies).
    let spec = if config.mode == Mode::Geo { spec.summed() } else { spec };
    let serving = config.delta_every.is_some() || config.online.is_some();
    if let (0, Some(out), true) = (config.trainer_id, &config.output, serving) {
        crate::persist::export::done_lines(&out.join("donefile.txt"))?;
    }
    if let Some(o) = &config.online {
        o.check_shares(config.trainers, config.trainer_id)?;
    }
    if let Some(from) = from {
        from.check_spec(&spec)?;
    }
    Ok((model, schema, spec))
}

/// Everything a trainer's passes share.
pub(super) struct Job<'a> {
    config: &'a TrainConfig,
    model: Model,
    schema: Schema,
    /// The tables as the servers hold them and the saves record them.
    spec: TableSpec,
    /// The tables with the job's rules: what a GEO trainer's copy runs (`spec` but in GEO).
    rules: TableSpec,
    me: usize,
    store: Store,
    /// This trainer's share of an offline job's files.
    files: Vec<PathBuf>,
    /// Where it starts (a rejoining trainer: where it was).
    start: Position,
    positions: Option<Mutex<PositionLog>>,
    telemetry: Option<Arc<telemetry::TrainerTelemetry>>,
    /// Serves `telemetry` while the job runs.
    _exporter: Option<crate::observe::telemetry::Exporter>,
    curves: Option<crate::observe::curves::CurveLog>,
    exports: crate::persist::export::ExportPlan,
    /// The warm start's lineage, for the manifests.
    warm: Option<String>,
    started: Instant,
    report: TrainReport,
    /// Steps so far, across passes.
    step: u64,
    /// Bytes of the passes read before this one, for progress.
    bytes_before: u64,
    /// GEO mode: exchanges so far, across passes (their numbers).
    geo_exchanges: u64,
}

/// What one pass trained, for its end.
pub(super) struct Trained {
    metrics: HeadMetrics,
    /// Samples a rejoining trainer had pushed in this pass before it restarted.
    resumed: u64,
    /// The pass's files, for messages.
    named: String,
    bad_lines: u64,
}

impl<'a> Job<'a> {
    /// Checks the job before training ([`checked`]) and opens what its passes share: the
    /// parameters' store, the position, the metrics endpoint, the curves.
    pub(super) fn start(
        config: &'a TrainConfig,
        registry: &Registry,
        from: Option<StartModel>,
    ) -> anyhow::Result<Job<'a>> {
        let started = Instant::now();
        let (model, schema, spec) = checked(config, registry, from.as_ref())?;
        let me = config.trainer_id;
        crate::base::fault::set_trainer_life(u64::from(config.rejoin));
        let warm = init_model::lineage(config.init_model.as_deref(), from.as_ref());
        let (mut store, first_pass) = open_store(config, &spec, from.as_ref(), warm.as_deref())?;
        let files = shard_files(&config.train_files, config.trainers, me);
        anyhow::ensure!(
            !files.is_empty(),
            "trainer {me} of {} has no training file: give at least as many files as trainers",
            config.trainers
        );
        let start = start_position(config, first_pass)?;
        catch_up_day_ends(config, &mut store, &start)?;
        let positions = match &config.positions {
            Some(dir) => Some(Mutex::new(PositionLog::create(dir, start.clone())?)),
            None => None,
        };
        let (telemetry, exporter) = match &config.metrics_addr {
            Some(addr) => {
                let t = Arc::new(telemetry::TrainerTelemetry::new(me));
                let shown = t.clone();
                (Some(t), Some(crate::observe::telemetry::Exporter::start(addr, Arc::new(move || shown.render()))?))
            }
            None => (None, None),
        };
        let shuffle = config.order().unwrap_or_else(|| "off".into());
        tracing::info!(trainer = me, files = files.len(), mode = ?config.mode, %shuffle, first_pass = start.pass, model = %model.summary(), "training");
        if config.sync_dense {
            let (parts, ramp) = (config.sync_dense_parts, config.sync_dense_ramp);
            let early = if ramp > 0 {
                format!(", in {} for the first {ramp} after the warm-up", parts * 2)
            } else {
                String::new()
            };
            tracing::info!(
                trainer = me,
                parts,
                step = config.sync_dense_step(),
                ramp,
                "sync_dense: dense steps merged over all trainers, each batch cut in {parts} step(s){early}"
            );
        }
        let curves = crate::observe::curves::CurveLog::open_all(
            config.metrics_csv.as_deref(),
            config.tensorboard.as_deref(),
            me as u32,
        )?;
        let report = TrainReport {
            trainer: me,
            samples: start.trained,
            train_seconds: 0.0,
            wall_seconds: 0.0,
            passes: Vec::new(),
            time: StepTimes::default(),
            discarded_pushes: 0,
            staleness: Staleness::default(),
            bad_lines: 0,
            clipped_steps: 0,
            days: Vec::new(),
        };
        let rules = model.table_spec(config.dense_optimizer, config.sparse_optimizer);
        Ok(Job {
            config,
            model,
            schema,
            spec,
            rules,
            me,
            store,
            files,
            step: start.step,
            start,
            positions,
            telemetry,
            _exporter: exporter,
            curves,
            exports: crate::persist::export::ExportPlan { delta_every: config.delta_every, based: false },
            warm,
            started,
            report,
            bytes_before: 0,
            geo_exchanges: 0,
        })
    }

    /// The passes this job trains: from where it starts to the last.
    pub(super) fn passes(&self) -> std::ops::RangeInclusive<u32> {
        self.start.pass..=self.config.passes
    }

    /// Trains pass `pass` over this trainer's share of its files.
    pub(super) fn train_pass(&mut self, pass: u32, on_progress: &dyn Fn(u64, u64)) -> anyhow::Result<Trained> {
        let (config, me) = (self.config, self.me);
        // A rejoining trainer goes on in the pass it was in, after the samples it pushed (and
        // in the warm-up, at the part after its last merged step).
        let resumed = if pass == self.start.pass { self.start.samples } else { 0 };
        let plan = WarmupPlan::new(config, pass == self.start.first_pass, self.step, resumed);
        if pass != self.start.pass {
            if let Some(p) = &self.positions {
                p.lock().start_pass(pass)?;
            }
        }
        // Online: this pass's split of its day, this trainer's share of it.
        let pass_files = match &config.online {
            Some(o) => shard_files(o.files(pass), config.trainers, me),
            None => self.files.clone(),
        };
        let named = files_named(&pass_files);
        let shuffle = config.shuffle_for(pass);
        let reader_config = ReaderConfig {
            skip_bad_lines: config.skip_bad_lines,
            skip: plan.reader_skip,
            shuffle,
            ..ReaderConfig::new(&self.schema, config.batch_size)
        };
        let reader = Reader::spawn(pass_files, reader_config);
        let progress = reader.progress();
        let pass_loop = PassLoop {
            config,
            model: &self.model,
            pass,
            step: AtomicU64::new(self.step),
            geo_exchanges: AtomicU64::new(self.geo_exchanges),
            spec: &self.rules,
            plan,
            positions: self.positions.as_ref(),
            curves: self.curves.as_ref().map(|log| (log, self.started)),
            telemetry: self.telemetry.as_deref(),
        };
        if let Some(t) = &self.telemetry {
            t.pass.store(pass as u64, Relaxed);
        }
        let before = self.bytes_before;
        let metrics = pass_loop.run(&mut self.store, reader, &mut self.report, &|samples| {
            on_progress(before + progress.bytes.load(Relaxed), samples)
        })?;
        self.step = pass_loop.step.load(Relaxed);
        self.geo_exchanges = pass_loop.geo_exchanges.load(Relaxed);
        self.bytes_before += progress.bytes.load(Relaxed);
        let bad_lines = progress.bad_lines.load(Relaxed);
        self.report.bad_lines += bad_lines;
        Ok(Trained { metrics, resumed, named, bad_lines })
    }

    /// A pass's end: its figures, the AUC over every trainer (each sends server 0 its
    /// histogram, the end-of-pass barrier waits for all, then each reads them merged), the
    /// saves and the day's end ([`Job::meet_and_save`]), the reports, curves and metrics.
    pub(super) fn end_of_pass(&mut self, pass: u32, trained: Trained) -> anyhow::Result<()> {
        let me = self.me;
        let trains: Vec<EvalReport> = trained.metrics.0.iter().map(PassMetrics::report).collect();
        // A pass over no sample (empty files, or every line bad) trained nothing, yet saved and
        // announced a model as if it had; a rejoining trainer past its last sample is fine.
        anyhow::ensure!(
            trains[0].samples > 0 || trained.resumed > 0,
            "pass {pass}: trainer {me} read no sample from its {}{}: nothing to train on",
            trained.named,
            skipped(trained.bad_lines)
        );
        for (name, t) in self.model.head_names().iter().zip(&trains) {
            tracing::info!(trainer = me, pass, samples = t.samples, head = %name, "pass done: {t}");
        }
        if self.report.staleness.count() > 0 {
            tracing::info!(trainer = me, pass, "push staleness so far: {}", self.report.staleness);
        }
        let first = &trained.metrics.0[0];
        let buckets = (!first.probs.is_empty()).then(|| AucBuckets::of(&first.probs, &first.labels));
        if let (Store::Remote(client), Some(b)) = (&mut self.store, &buckets) {
            client.pass_auc(me, pass, b).with_context(|| format!("sending pass {pass}'s AUC histogram"))?;
        }
        let (tests, day) = self.meet_and_save(pass)?;
        let all_trainers = self.all_trainers_auc(pass, buckets)?;
        let names = self.model.head_names();
        let heads = match trains.len() {
            1 => Vec::new(),
            n => (0..n)
                .map(|h| HeadReport { output: names[h].clone(), train: trains[h].clone(), test: tests.get(h).cloned() })
                .collect(),
        };
        let next_day = day.as_ref().and_then(|d| d.next_day.clone());
        if let Some(mut day) = day {
            day.train_auc = all_trainers.as_ref().and_then(|a| a.auc);
            let next = day.next_day.as_ref().map_or("-".to_string(), |e| e.to_string());
            tracing::info!(date = %day.date, rows = ?day.rows, shrunk = day.shrunk_rows, "day done; next day's first split: {next}");
            self.report.days.push(day);
        }
        let done = PassReport { pass, train: trains[0].clone(), test: tests.first().cloned(), heads, all_trainers };
        if let Some(t) = &self.telemetry {
            t.pass_loss.store(done.train.loss.to_bits(), Relaxed);
            t.pass_auc.store(done.train.auc.unwrap_or(f64::NAN).to_bits(), Relaxed);
        }
        if let Some(log) = &self.curves {
            let seconds = self.started.elapsed().as_secs_f64();
            for p in done.curve_points(me as u32, self.step, self.report.samples, seconds, next_day.as_ref()) {
                log.write(&p);
            }
        }
        self.report.passes.push(done);
        Ok(())
    }

    /// The pass's AUC over every trainer that sent a histogram (after the pass's barrier).
    fn all_trainers_auc(&mut self, pass: u32, buckets: Option<AucBuckets>) -> anyhow::Result<Option<AllTrainersAuc>> {
        let me = self.me;
        let all = match (&mut self.store, buckets) {
            (Store::Remote(client), Some(_)) => {
                let g = client.global_auc(pass).with_context(|| format!("reading pass {pass}'s AUC"))?;
                Some(AllTrainersAuc::of(&g.buckets, g.trainers))
            }
            (Store::Local(..), Some(b)) => Some(AllTrainersAuc::of(&b, vec![me as u64])),
            (_, None) => None,
        };
        if let Some(a) = &all {
            tracing::info!(trainer = me, pass, samples = a.samples, trainers = ?a.trainers, "pass figures over all trainers (Paddle's buckets): {a}");
        }
        Ok(all)
    }

    /// Barrier; trainer 0's part of the pass's end (the day's shrink, the save for serving, the
    /// pass's save, the test and next-day figures); barrier.
    fn meet_and_save(&mut self, pass: u32) -> anyhow::Result<(Vec<EvalReport>, Option<DayReport>)> {
        let (config, me) = (self.config, self.me);
        if let Store::Remote(client) = &mut self.store {
            client.end_pass(me, pass)?;
            client.barrier(me, 2 * pass as u64 - 1).with_context(|| format!("end of pass {pass}"))?;
        }
        let (mut tests, mut day) = (Vec::new(), None);
        if me == 0 {
            // Online: the pass's day and its number within the day; a day ends with a shrink.
            let slot = config.online.as_ref().map(|o| (o, o.slot(pass)));
            let (date, day_pass, day_end) = match slot {
                Some((o, s)) => (o.date_number(s.day), s.pass, s.day_end),
                None => (0, pass, false),
            };
            if let (Some((o, s)), true) = (slot, day_end) {
                day_end_fault(DayEndPoint::BeforeShrink);
                let shrunk_rows =
                    self.store.shrink_day_end(pass).with_context(|| format!("the shrink at the end of day {date}"))?;
                day_end_fault(DayEndPoint::Shrunk);
                day = Some(DayReport { date: o.days[s.day].0.clone(), shrunk_rows, ..DayReport::default() });
            }
            if let Some(out) = &config.output {
                // Before the pass's checkpoint: a crash between the two redoes the pass, saves
                // again and announces the save once; the other order could lose its line.
                if let Some(kind) = self.exports.due(day_pass, day_end) {
                    save_for_serving(out, &mut self.store, &self.spec, kind, date, day_pass)?;
                }
                if day_end {
                    day_end_fault(DayEndPoint::SavedForServing);
                }
                self.save_pass(out, pass)?;
                if day_end {
                    day_end_fault(DayEndPoint::Saved);
                }
            }
            tests = self.test_figures(pass)?;
            if let (Some((o, s)), Some(d)) = (slot, day.as_mut()) {
                self.day_figures(o, s.day, d)?;
            }
        }
        if let Store::Remote(client) = &mut self.store {
            client.barrier(me, 2 * pass as u64).with_context(|| format!("after saving pass {pass}"))?;
        }
        Ok((tests, day))
    }

    /// Trainer 0 saves pass `pass` into `out`'s pass folder with its manifest, unless a life of
    /// it before a restart did.
    fn save_pass(&mut self, out: &std::path::Path, pass: u32) -> anyhow::Result<()> {
        let config = self.config;
        let dir = out.join(pass_dir_name(pass));
        saves::no_link_at(&dir)?;
        if saves::saved_before(&dir, &config.job, pass, config.rejoin)? {
            tracing::info!(pass, dir = %dir.display(), "the pass was saved before this trainer restarted: kept as it is");
            return Ok(());
        }
        let shards = self.store.save(&dir).with_context(|| format!("saving pass {pass} to {}", dir.display()))?;
        let mut model = description(config, Some(self.step), self.warm.as_deref());
        if let Some(o) = &config.online {
            // Where a resume must count from (`Online::check_resume`).
            model["online"] = serde_json::to_value(o.saved_day(pass))?;
        }
        let manifest = Manifest {
            format: FORMAT_VERSION,
            job: config.job.clone(),
            pass,
            num_servers: shards.len(),
            spec: self.spec.clone(),
            model,
            shards,
        };
        manifest.write(&dir)?;
        tracing::info!(pass, dir = %dir.display(), "model saved");
        Ok(())
    }

    /// Trainer 0's figures of the model on the test files, per head.
    fn test_figures(&mut self, pass: u32) -> anyhow::Result<Vec<EvalReport>> {
        let config = self.config;
        if config.test_files.is_empty() {
            return Ok(Vec::new());
        }
        let batch = config.batch_size.max(1024);
        let (model, schema) = (&self.model, &self.schema);
        let tests = evaluate_heads(&mut self.store, model, schema, &config.test_files, batch, config.skip_bad_lines)?;
        for (name, r) in model.head_names().iter().zip(&tests) {
            tracing::info!(pass, samples = r.samples, head = %name, "test: {r}");
        }
        Ok(tests)
    }

    /// At a day's end: the day's model on the next day's first split (before any training on
    /// it), and every server's rows and memory.
    fn day_figures(
        &mut self,
        online: &crate::train::job_config::Online,
        day: usize,
        d: &mut DayReport,
    ) -> anyhow::Result<()> {
        let config = self.config;
        if let Some(next) = online.next_first_split(day) {
            let batch = config.batch_size.max(1024);
            let (model, schema) = (&self.model, &self.schema);
            let heads = evaluate_heads(&mut self.store, model, schema, next, batch, config.skip_bad_lines)?;
            d.next_day = heads.into_iter().next();
        }
        for (rows, rss, peak) in self.store.footprint()? {
            d.rows.push(rows);
            d.rss_bytes.push(rss);
            d.peak_rss_bytes.push(peak);
        }
        Ok(())
    }

    /// Closes this trainer at the servers, marks its position record finished, and returns
    /// its report.
    pub(super) fn finish(mut self) -> anyhow::Result<TrainReport> {
        if let Store::Remote(client) = &mut self.store {
            client.close(self.me)?;
        }
        if let Some(p) = &self.positions {
            p.lock().finish()?;
        }
        self.report.wall_seconds = self.started.elapsed().as_secs_f64();
        if self.report.clipped_steps > 0 {
            let max = self.config.clip_grad_norm.unwrap_or_default();
            tracing::info!(
                trainer = self.me,
                steps = self.report.clipped_steps,
                "steps' gradients clipped to norm {max}"
            );
        }
        Ok(self.report)
    }
}
