//! `oar bench --roofline`: how close oar's training comes to what the machine can do.
//!
//! (1) The matrix products of one CTR-DNN training step (each layer's forward, weight gradient
//!     and input gradient, at the batch's rows), timed with oar's own kernel ([`crate::nn::matmul`])
//!     and with a reference BLAS ([`super::blas`]) on one thread, in alternating rounds: GFLOP/s
//!     of each and their ratio; then both on every core at once, a whole step per thread (as a
//!     trainer's replicas run): the machine's peak at these shapes.
//! (2) Local training of the CTR-DNN on one thread and on every core: the FLOP/s of its matrix
//!     products over the training loop's time, as a share of (1)'s peaks, and where a step's
//!     time went: matrix products (counted inside `matmul`), the other layers, the embedding
//!     pull, the push with the optimizer, waiting for data (the loop's own timers).
//! (3) The same training on one server and one trainer over loopback: a distributed step's
//!     time, its time on the server's replies (counted by the client) split into the server's
//!     handling of them (counted by the server) and the transport.
//! (4) With `--model NAME` (or `all`), instead of (1) to (3): the products a zoo model's training
//!     records, shape by shape, against the reference ([`super::zoo_products`]).
//!
//! The CPU's name, whether it has bf16 products (AVX512_BF16, which oar uses; AMX-BF16 is
//! named, not used) and one core's arithmetic peak in f32 and bf16 ([`super::peak`]) head the
//! output; OpenBLAS is told this CPU's kernel family where it would not know it. Where the CPU
//! has bf16 products, (1) times oar's kernel in bf16 too and (2) trains in bf16 too
//! (`precision = "bf16"`).

use std::path::PathBuf;
use std::time::Instant;

use super::blas::Blas;
use super::median;
use crate::nn::record::ProductShape;
use crate::nn::Precision;
use crate::train::job_config::JobConfig;

/// Most rows a step `--roofline` times (its operands then take about 1 GiB).
pub const MAX_BATCH: usize = 1 << 18;

/// What `oar bench --roofline` measures.
#[derive(Clone, Debug)]
pub struct RooflineConfig {
    /// The reference BLAS to load (a file name or path with `cblas_sgemm`).
    pub blas: String,
    /// Rows per step (the CTR-DNN's batch).
    pub batch: usize,
    /// Alternating rounds of (1); medians are reported.
    pub rounds: usize,
    /// Seconds each kernel is timed for, per product and round.
    pub seconds: f64,
    /// Training data for (2): a folder with `train/` and `test/`; generated if absent.
    pub data: Option<PathBuf>,
    /// Lines to generate for (2) when no data set is given.
    pub lines: u64,
    /// Instead of (1) to (3): these zoo models' products, or every one's with `all`
    /// ([`super::zoo_products`]).
    pub models: Vec<String>,
}

/// One matrix product of a training step, named: a weight gradient reads the layer's input
/// transposed, an input gradient the weights.
#[derive(Clone, Debug, PartialEq)]
struct Product {
    /// The layer and the pass (`fc1 forward`, `fc1 dW`, `fc1 dx`).
    name: String,
    shape: ProductShape,
}

/// The products of one training step of a stack of linear layers of `widths` (input, hidden
/// layers, output) at `rows` rows, as `nn::Linear` computes them: `y = x W`, `dW = x^T dy`,
/// `dx = dy W^T` (the first layer's too: it feeds the embeddings' gradients).
fn products(widths: &[usize], rows: usize) -> Vec<Product> {
    let mut out = Vec::new();
    for (l, w) in widths.windows(2).enumerate() {
        let (i, o) = (w[0], w[1]);
        let product = |pass: &str, (m, n, k), (a_transposed, b_transposed)| Product {
            name: format!("fc{} {pass}", l + 1),
            shape: ProductShape { m, n, k, a_transposed, b_transposed },
        };
        out.push(product("forward", (rows, o, i), (false, false)));
        out.push(product("dW", (i, o, rows), (true, false)));
        out.push(product("dx", (rows, i, o), (false, true)));
    }
    out
}

/// The CPU's name and its flags that matter here, from `/proc/cpuinfo`.
fn cpu() -> (String, Vec<String>) {
    let text = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |key: &str| {
        text.lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_default()
    };
    let flags = field("flags");
    let wanted = ["avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16"];
    let have = wanted.iter().filter(|w| flags.split(' ').any(|f| f == **w)).map(|w| w.to_string()).collect();
    (field("model name"), have)
}

/// Names OpenBLAS's kernels for this CPU's widest vectors (`OPENBLAS_CORETYPE`) unless the
/// user did: OpenBLAS picks them by the CPU's model number, and one it does not know (0.3.21 on
/// a recent Xeon) gets its SSE3 "Prescott" kernels, a reference 4x slower than it can be. Runs
/// before the library is loaded, which reads the variable, and before any thread starts.
fn pick_openblas_kernels(flags: &[String]) {
    if std::env::var_os("OPENBLAS_CORETYPE").is_some() {
        return;
    }
    let has = |f: &str| flags.iter().any(|g| g == f);
    let core = if has("avx512f") {
        "SkylakeX"
    } else if has("avx2") && has("fma") {
        "Haswell"
    } else {
        return;
    };
    std::env::set_var("OPENBLAS_CORETYPE", core);
}

/// Seconds per call of `f`, over as many calls as fill `seconds` (at least 3, after one to
/// warm the caches).
fn per_call(seconds: f64, mut f: impl FnMut()) -> f64 {
    f();
    let started = Instant::now();
    let mut calls = 0u32;
    while calls < 3 || started.elapsed().as_secs_f64() < seconds {
        f();
        calls += 1;
    }
    started.elapsed().as_secs_f64() / f64::from(calls)
}

/// Operands of a product, filled with small values (sums stay far from overflow however often
/// the product accumulates into `dst`).
struct Operands {
    a: Vec<f32>,
    b: Vec<f32>,
    dst: Vec<f32>,
}

impl Operands {
    fn new(p: &ProductShape) -> Operands {
        let fill = |n: usize, seed: usize| (0..n).map(|i| ((i * 7919 + seed) % 1000) as f32 * 1e-6).collect();
        Operands { a: fill(p.m * p.k, 1), b: fill(p.k * p.n, 2), dst: vec![0.0; p.m * p.n] }
    }

    fn run(&mut self, kernel: Kernel, p: &ProductShape) {
        let (ta, tb) = (p.a_transposed, p.b_transposed);
        match kernel {
            Kernel::Oar(precision) => {
                let sa = if ta { (1, p.m) } else { (p.k, 1) };
                let sb = if tb { (1, p.k) } else { (p.n, 1) };
                crate::nn::with_precision(precision, || {
                    crate::nn::matmul(p.m, p.n, p.k, &mut self.dst, true, &self.a, sa, &self.b, sb)
                });
            }
            Kernel::Reference(blas) => blas.sgemm(p.m, p.n, p.k, &mut self.dst, &self.a, ta, &self.b, tb),
        }
    }
}

/// Who multiplies: oar's kernel at a precision, or the reference BLAS (f32).
#[derive(Clone, Copy)]
enum Kernel<'a> {
    Oar(Precision),
    Reference(&'a Blas),
}

/// One product's medians: seconds a call with oar's kernel in f32, in bf16 (where the CPU has
/// it) and with the reference, and the medians of the rounds' bf16 / f32 and oar / reference
/// speed ratios.
pub(super) struct Timed {
    pub(super) oar: f64,
    bf16: Option<f64>,
    bf16_ratio: Option<f64>,
    pub(super) blas: Option<f64>,
    pub(super) ratio: Option<f64>,
}

/// The median of `v`, if it holds any.
fn median_of(v: Vec<f64>) -> Option<f64> {
    (!v.is_empty()).then(|| median(v))
}

/// Times each of `products` with oar's kernel (in f32, and in bf16 where `bf16`) and with
/// `blas` (if any) in `config.rounds` alternating rounds.
pub(super) fn time_products(
    config: &RooflineConfig,
    blas: Option<&Blas>,
    bf16: bool,
    products: &[ProductShape],
) -> Vec<Timed> {
    products
        .iter()
        .map(|p| {
            let mut ops = Operands::new(p);
            let mut time = |kernel: Kernel| per_call(config.seconds, || ops.run(kernel, p));
            let (mut oar, mut half, mut reference) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..config.rounds {
                oar.push(time(Kernel::Oar(Precision::F32)));
                if bf16 {
                    half.push(time(Kernel::Oar(Precision::Bf16)));
                }
                if let Some(b) = blas {
                    reference.push(time(Kernel::Reference(b)));
                }
            }
            let ratios = |v: &[f64]| median_of(v.iter().zip(&oar).map(|(other, oar)| other / oar).collect());
            let (bf16_ratio, ratio) = (ratios(&half).map(|r| 1.0 / r), ratios(&reference));
            Timed { oar: median(oar), bf16: median_of(half), bf16_ratio, blas: median_of(reference), ratio }
        })
        .collect()
}

/// A step's matrix products in FLOP/s, with oar's kernel in f32 and in bf16 (where the CPU
/// has it), and with the reference (if any).
#[derive(Clone, Copy)]
struct Peak {
    oar: f64,
    bf16: Option<f64>,
    reference: Option<f64>,
}

/// The step's products on `threads` threads at once, each thread a whole step of its own on
/// operands of its own (as a trainer's replicas run), in FLOP/s over all threads: oar's kernel
/// (f32, and bf16 where `bf16`) and the reference in alternating rounds (medians).
fn all_cores(
    config: &RooflineConfig,
    blas: Option<&Blas>,
    bf16: bool,
    products: &[ProductShape],
    threads: usize,
) -> Peak {
    let flops: f64 = products.iter().map(ProductShape::flops).sum();
    let at_once = |kernel: Kernel| {
        std::thread::scope(|s| {
            let each: Vec<_> = (0..threads)
                .map(|_| {
                    s.spawn(|| {
                        let mut ops: Vec<Operands> = products.iter().map(Operands::new).collect();
                        let step = per_call(config.seconds, || {
                            for (p, o) in products.iter().zip(&mut ops) {
                                o.run(kernel, p);
                            }
                        });
                        flops / step
                    })
                })
                .collect();
            each.into_iter().map(|h| h.join().unwrap_or(0.0)).sum::<f64>()
        })
    };
    let (mut oar, mut half, mut reference) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..config.rounds {
        oar.push(at_once(Kernel::Oar(Precision::F32)));
        if bf16 {
            half.push(at_once(Kernel::Oar(Precision::Bf16)));
        }
        if let Some(b) = blas {
            reference.push(at_once(Kernel::Reference(b)));
        }
    }
    Peak { oar: median(oar), bf16: median_of(half), reference: median_of(reference) }
}

/// Prints (1); returns the step's peaks on one thread and on every core (`cores`).
fn kernels(config: &RooflineConfig, blas: Option<&Blas>, products: &[Product], cores: usize) -> (Peak, Peak) {
    let bf16 = crate::nn::bf16_available();
    println!(
        "(1) matrix products of one CTR-DNN training step at {} rows, one thread (medians of {} alternating rounds){}",
        config.batch,
        config.rounds,
        if bf16 { "" } else { "; no bf16 column: this CPU has no avx512_bf16" }
    );
    println!(
        "| product | m x k x n | oar GFLOP/s | oar bf16 GFLOP/s | bf16 / f32 | reference GFLOP/s | oar / reference |"
    );
    println!("|---|---|---|---|---|---|---|");
    let shapes: Vec<ProductShape> = products.iter().map(|p| p.shape).collect();
    let timed = time_products(config, blas, bf16, &shapes);
    let gflops = |p: &ProductShape, t: f64| p.flops() / t / 1e9;
    let show = |v: Option<f64>, f: &dyn Fn(f64) -> String| v.map_or("-".to_string(), f);
    let ratio = |v: Option<f64>| show(v, &|r| format!("{r:.2}"));
    for (Product { name, shape: p }, t) in products.iter().zip(&timed) {
        let rate = |v: Option<f64>| show(v, &|t| format!("{:.1}", gflops(p, t)));
        println!(
            "| {name} | {} x {} x {} | {:.1} | {} | {} | {} | {} |",
            p.m,
            p.k,
            p.n,
            gflops(p, t.oar),
            rate(t.bf16),
            ratio(t.bf16_ratio),
            rate(t.blas),
            ratio(t.ratio)
        );
    }
    let flops: f64 = shapes.iter().map(ProductShape::flops).sum();
    let step = |pick: &dyn Fn(&Timed) -> Option<f64>| {
        let times: Option<Vec<f64>> = timed.iter().map(pick).collect();
        times.map(|t| flops / t.iter().sum::<f64>())
    };
    let one =
        Peak { oar: step(&|t| Some(t.oar)).unwrap_or(0.0), bf16: step(&|t| t.bf16), reference: step(&|t| t.blas) };
    let giga = |v: Option<f64>| show(v, &|r| format!("{:.1}", r / 1e9));
    println!(
        "| the step ({:.2} MFLOP a sample) | | {:.1} | {} | {} | {} | {} |",
        flops / config.batch as f64 / 1e6,
        one.oar / 1e9,
        giga(one.bf16),
        ratio(one.bf16.map(|h| h / one.oar)),
        giga(one.reference),
        ratio(one.reference.map(|r| one.oar / r))
    );
    if cores < 2 {
        return (one, one);
    }
    let all = all_cores(config, blas, bf16, &shapes, cores);
    println!(
        "    on {cores} threads at once, a step each (the machine's peak at these shapes): oar {:.1} GFLOP/s{}{}",
        all.oar / 1e9,
        all.bf16.map_or(String::new(), |h| format!(", in bf16 {:.1} (bf16 / f32 {:.2})", h / 1e9, h / all.oar)),
        all.reference.map_or(String::new(), |r| format!(
            ", the reference {:.1} (oar / reference {:.2})",
            r / 1e9,
            all.oar / r
        ))
    );
    (one, all)
}

/// Prints (2): local training on `threads` threads at `precision` (no test set: the counters
/// hold the training loop's products alone), its matrix products' FLOP/s against the peaks, and
/// (one thread) where a step's time went.
fn training(
    job: &JobConfig,
    data: &std::path::Path,
    threads: usize,
    precision: Precision,
    peak: Peak,
) -> anyhow::Result<()> {
    let mut job = job.clone();
    job.train.precision = precision;
    let config =
        crate::train::TrainConfig { test_files: Vec::new(), ..super::training::local_config(data, threads, job)? };
    // Counted here alone: the kernels' timings in (1) and (4) run without the counters' cost.
    let _counting = crate::nn::record::count_products();
    let (seconds0, flops0) = crate::nn::record::totals();
    let r = crate::train::run(&config, &|_, _| {})?;
    let (seconds1, flops1) = crate::nn::record::totals();
    let (in_matmul, flops) = ((seconds1 - seconds0) / threads as f64, (flops1 - flops0) as f64);
    let rate = flops / r.train_seconds;
    let share = |peak: f64| format!("{:.0}%", 100.0 * rate / peak);
    let (kernel, reference) = match precision {
        Precision::Bf16 => (peak.bf16.unwrap_or(peak.oar), None),
        Precision::F32 => (peak.oar, peak.reference),
    };
    println!(
        "    {threads} thread(s), {}: {:.0} samples/s in the training loop, {:.2} MFLOP of matrix products a sample (counted); {:.1} GFLOP/s over the loop's time = {} of oar's kernel{}",
        precision.name(),
        r.samples as f64 / r.train_seconds,
        flops / r.samples.max(1) as f64 / 1e6,
        rate / 1e9,
        share(kernel),
        reference.map_or(String::new(), |p| format!(", {} of the reference", share(p)))
    );
    if threads == 1 {
        let t = &r.time;
        let other = (t.compute - in_matmul).max(0.0);
        let part = |s: f64| format!("{:.0}%", 100.0 * s / r.train_seconds);
        println!(
            "      a step's time: matrix products {} ({:.1} GFLOP/s while in them), other layers and the loss {}, embedding pull {}, push and optimizer {}, waiting for data {}",
            part(in_matmul),
            flops / in_matmul / 1e9,
            part(other),
            part(t.pull),
            part(t.push),
            part(t.data)
        );
    }
    Ok(())
}

/// Prints (3): the CTR-DNN on one server (a process of this build) and one trainer (this
/// process, one thread, async, pulls in line) over loopback: where a distributed step's time
/// went, the time on the server's replies split into the server's own handling (its counters)
/// and the transport (copies into and out of the sockets, the loopback, wake-ups).
fn distributed(job: &JobConfig, data: &std::path::Path) -> anyhow::Result<()> {
    let server = super::ServerProc::start(&std::env::current_exe()?)?;
    let config = crate::train::TrainConfig {
        mode: crate::protocol::Mode::Async,
        servers: vec![server.addr.clone()],
        test_files: Vec::new(),
        ..super::training::local_config(data, 1, job.clone())?
    };
    let _counting = crate::nn::record::count_products();
    let (matmul0, replies0) = (crate::nn::record::totals().0, crate::client::reply_seconds());
    let r = crate::train::run(&config, &|_, _| {})?;
    let in_matmul = crate::nn::record::totals().0 - matmul0;
    let replies = crate::client::reply_seconds() - replies0;
    let tool = crate::client::ClientConfig::new(
        vec![server.addr.clone()],
        "bench",
        std::time::Duration::from_secs(10),
        std::time::Duration::from_secs(60),
    );
    let stats = crate::client::Client::connect(&tool)?.stats()?;
    let served: f64 = stats.iter().map(|s| s.pull_seconds + s.push_seconds).sum();
    let t = &r.time;
    let part = |s: f64| format!("{:.0}%", 100.0 * s / r.train_seconds);
    println!(
        "    {:.0} samples/s in the training loop; a step's time: matrix products {}, other layers and the loss {}, \
         the trainer's own pull and push work (deduplicating, routing, encoding, placing rows) {}, on the server's \
         replies {} (the server handling them, its table and optimizers: {}; the transport: {}), waiting for data {}",
        r.samples as f64 / r.train_seconds,
        part(in_matmul),
        part((t.compute - in_matmul).max(0.0)),
        part((t.pull + t.push - replies).max(0.0)),
        part(replies),
        part(served.min(replies)),
        part((replies - served).max(0.0)),
        part(t.data)
    );
    server.stop();
    Ok(())
}

/// The CTR-DNN's job (`examples/ctr_dnn.toml`) at `batch` rows a step.
fn ctr_dnn(batch: usize) -> anyhow::Result<JobConfig> {
    let mut job: JobConfig = toml::from_str(super::CTR_DNN)?;
    job.train.batch_size = batch;
    Ok(job)
}

/// Runs (1) to (3), or with `config.models` (4), and prints them.
pub fn run(config: &RooflineConfig) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=MAX_BATCH).contains(&config.batch) && (1..=1000).contains(&config.rounds),
        "--roofline takes --batch 1 to {MAX_BATCH} and --rounds 1 to 1000"
    );
    // Named models are checked before anything is measured.
    let models = if config.models.is_empty() { None } else { Some(super::zoo_products::pick(&config.models)?) };
    let blas = machine(config);
    let tmp = std::env::temp_dir().join(format!("oar-roofline-{}", std::process::id()));
    let data = super::bench_data(config.data.as_deref(), config.lines, 2, &tmp);
    let result = data.and_then(|data| match models {
        Some(models) => super::zoo_products::run(config, blas.as_ref(), &models, &data),
        None => ctr_dnn_steps(config, blas.as_ref(), &data),
    });
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

/// Prints the CPU, one core's arithmetic peaks and the reference BLAS, which it returns loaded
/// (one thread), or `None` with the reason printed.
fn machine(config: &RooflineConfig) -> Option<Blas> {
    let (name, flags) = cpu();
    println!(
        "CPU: {name} ({}); bf16 products: {}",
        flags.join(" "),
        if crate::nn::bf16_available() { "available" } else { "not on this CPU (no avx512_bf16), f32 only" }
    );
    let fma = super::peak::f32_fma(config.seconds);
    let dot = super::peak::bf16_dot(config.seconds);
    println!(
        "one core's arithmetic peak (independent operations on registers): f32 FMA {:.1} GFLOP/s{}",
        fma / 1e9,
        dot.map_or(String::new(), |d| format!(
            ", bf16 pair products {:.1} GFLOP/s (bf16 / f32 {:.2})",
            d / 1e9,
            d / fma
        ))
    );
    pick_openblas_kernels(&flags);
    match Blas::load(&config.blas) {
        Ok(b) => {
            b.set_threads(1);
            println!("reference BLAS: {}", b.name);
            Some(b)
        }
        Err(e) => {
            println!("reference BLAS: none ({e}); oar's kernel alone (Debian: apt install libopenblas0)");
            None
        }
    }
}

/// (1) to (3) on the CTR-DNN, training on `data`.
fn ctr_dnn_steps(config: &RooflineConfig, blas: Option<&Blas>, data: &std::path::Path) -> anyhow::Result<()> {
    let job = ctr_dnn(config.batch)?;
    let m = job.model.with_shorthand_defaults();
    let input =
        m.slots.unwrap_or_default() * m.embedding_dim.unwrap_or_default() + m.dense_features.unwrap_or_default();
    let widths: Vec<usize> = std::iter::once(input).chain(m.hidden.unwrap_or_default()).chain(m.outputs).collect();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (one, all) = kernels(config, blas, &products(&widths, config.batch), cores);
    println!("(2) the CTR-DNN trained locally at batch {}, its matrix products against (1)'s step", config.batch);
    let bf16 = crate::nn::bf16_available().then_some(Precision::Bf16);
    for precision in std::iter::once(Precision::F32).chain(bf16) {
        training(&job, data, 1, precision, one)?;
        if cores > 1 {
            training(&job, data, cores, precision, all)?;
        }
    }
    println!("(3) the same on 1 server x 1 trainer over loopback (async, 1 thread, pulls in line)");
    distributed(&job, data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_has_three_products_a_layer_with_the_layers_shapes() {
        let p = products(&[273, 400, 1], 512);
        let shapes: Vec<_> = p
            .iter()
            .map(|Product { name, shape: s }| (name.as_str(), s.m, s.k, s.n, s.a_transposed, s.b_transposed))
            .collect();
        assert_eq!(
            shapes,
            [
                ("fc1 forward", 512, 273, 400, false, false),
                ("fc1 dW", 273, 512, 400, true, false),
                ("fc1 dx", 512, 400, 273, false, true),
                ("fc2 forward", 512, 400, 1, false, false),
                ("fc2 dW", 400, 512, 1, true, false),
                ("fc2 dx", 512, 1, 400, false, true),
            ]
        );
        let flops: f64 = p.iter().map(|p| p.shape.flops()).sum();
        assert_eq!(flops, 6.0 * 512.0 * (273.0 * 400.0 + 400.0));
    }
}
