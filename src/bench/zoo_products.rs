//! `oar bench --roofline --model NAME` (or `--model all`): oar's matrix kernel against the
//! reference BLAS at the zoo's own shapes. Each named zoo model trains one pass locally on one
//! thread with its products recorded ([`crate::nn::record::record_products`]), so the shapes
//! are the ones its layers really multiply (attention heads, cross layers, CIN maps, the MLPs,
//! forward and backward), not a list kept by hand. Only whether an operand is stored transposed
//! is kept, not its strides: an attention head's columns of a wider matrix are timed as a
//! matrix of their own. Every shape carrying at least
//! [`TIMED_SHARE`] of the model's product FLOPs is then timed with both kernels in alternating
//! rounds, each shape once however many models share it. A model's ratio weighs each shape by
//! its calls: the time its recorded products take with the reference over the time with oar.

use std::collections::HashMap;
use std::path::Path;

use super::blas::Blas;
use super::roofline::{time_products, RooflineConfig, Timed};
use super::ZOO;
use crate::nn::record::{record_products, ProductShape};

/// Shapes below this share of a model's product FLOPs are counted but not timed.
pub const TIMED_SHARE: f64 = 0.01;

/// One model's recorded products and what timing them found.
struct ModelProducts {
    name: &'static str,
    samples: u64,
    /// Every recorded shape with its calls, largest share of the FLOPs first.
    shapes: Vec<(ProductShape, u64)>,
}

impl ModelProducts {
    fn flops(&self) -> f64 {
        self.shapes.iter().map(|(s, calls)| s.flops() * *calls as f64).sum()
    }

    /// The shapes worth timing: each at least [`TIMED_SHARE`] of the FLOPs.
    fn timed(&self) -> impl Iterator<Item = &(ProductShape, u64)> {
        let total = self.flops();
        self.shapes.iter().filter(move |(s, calls)| s.flops() * *calls as f64 >= TIMED_SHARE * total)
    }
}

/// The zoo models `names` asks for (`all`: every one), in the zoo's order; an unknown name is an
/// error naming the zoo's.
pub fn pick(names: &[String]) -> anyhow::Result<Vec<(&'static str, &'static str)>> {
    let zoo = ZOO.map(|(n, _)| n);
    if let Some(unknown) = names.iter().find(|n| *n != "all" && !zoo.contains(&n.as_str())) {
        anyhow::bail!("--model {unknown:?}: the zoo has {} (or all)", zoo.join(", "));
    }
    let all = names.iter().any(|n| n == "all");
    Ok(ZOO.iter().copied().filter(|(n, _)| all || names.iter().any(|m| m == n)).collect())
}

/// Trains `job` one pass on `data` locally on one thread (no test set), recording its products.
fn record(name: &'static str, job: &str, data: &Path, batch: usize) -> anyhow::Result<ModelProducts> {
    let mut job: crate::train::job_config::JobConfig = toml::from_str(job)?;
    job.train.batch_size = batch;
    let config = crate::train::TrainConfig { test_files: Vec::new(), ..super::training::local_config(data, 1, job)? };
    let (r, mut shapes) = record_products(|| crate::train::run(&config, &|_, _| {}));
    let r = r?;
    shapes.sort_by(|(a, ca), (b, cb)| (b.flops() * *cb as f64).total_cmp(&(a.flops() * *ca as f64)));
    Ok(ModelProducts { name, samples: r.samples, shapes })
}

/// How a shape is stored: `a` or `a^T` times `b` or `b^T`.
fn layout(s: &ProductShape) -> String {
    format!("{} {}", if s.a_transposed { "a^T" } else { "a" }, if s.b_transposed { "b^T" } else { "b" })
}

/// Prints one model's shapes and returns its row of the summary.
fn report(m: &ModelProducts, timed: &HashMap<ProductShape, Timed>) -> String {
    let total = m.flops();
    println!(
        "    {}: {:.3} MFLOP of matrix products a sample, {} shapes ({} samples trained)",
        m.name,
        total / m.samples.max(1) as f64 / 1e6,
        m.shapes.len(),
        m.samples
    );
    println!("| m x k x n | stored | calls | share of the FLOPs | oar GFLOP/s | reference GFLOP/s | oar / reference |");
    println!("|---|---|---|---|---|---|---|");
    let (mut flops, mut oar, mut reference, mut least) = (0.0, 0.0, Some(0.0), None::<(f64, ProductShape)>);
    for (s, calls) in m.timed() {
        let t = &timed[s];
        let (work, n) = (s.flops() * *calls as f64, *calls as f64);
        flops += work;
        oar += t.oar * n;
        reference = reference.zip(t.blas).map(|(sum, b)| sum + b * n);
        if let Some(r) = t.ratio.filter(|r| least.is_none_or(|(l, _)| *r < l)) {
            least = Some((r, *s));
        }
        let rate = |secs: f64| format!("{:.1}", s.flops() / secs / 1e9);
        println!(
            "| {} x {} x {} | {} | {} | {:.1}% | {} | {} | {} |",
            s.m,
            s.k,
            s.n,
            layout(s),
            calls,
            100.0 * work / total,
            rate(t.oar),
            t.blas.map_or("-".into(), rate),
            t.ratio.map_or("-".into(), |r| format!("{r:.2}"))
        );
    }
    let untimed = m.shapes.len() - m.timed().count();
    if untimed > 0 {
        println!(
            "| {untimed} other shapes | | | {:.1}% | not timed (each under {:.0}%) | | |",
            100.0 * (1.0 - flops / total),
            100.0 * TIMED_SHARE
        );
    }
    let giga = |secs: f64| format!("{:.1}", flops / secs / 1e9);
    format!(
        "| {} | {:.3} | {} ({:.0}% of the FLOPs) | {} | {} | {} | {} |",
        m.name,
        total / m.samples.max(1) as f64 / 1e6,
        m.timed().count(),
        100.0 * flops / total,
        giga(oar),
        reference.map_or("-".into(), giga),
        reference.map_or("-".into(), |r| format!("{:.2}", r / oar)),
        least.map_or("-".into(), |(r, s)| format!("{r:.2} at {} x {} x {} ({})", s.m, s.k, s.n, layout(&s)))
    )
}

/// Records, times and prints the products of `models` (from [`pick`]) trained on `data`.
pub fn run(
    config: &RooflineConfig,
    blas: Option<&Blas>,
    models: &[(&'static str, &'static str)],
    data: &Path,
) -> anyhow::Result<()> {
    println!(
        "(4) the zoo's matrix products, recorded from one pass of local training at batch {}, timed on one thread \
         (medians of {} alternating rounds; shapes under {:.0}% of a model's FLOPs counted, not timed)",
        config.batch,
        config.rounds,
        100.0 * TIMED_SHARE
    );
    let mut timed: HashMap<ProductShape, Timed> = HashMap::new();
    let mut rows = Vec::new();
    for (name, job) in models {
        let m = record(name, job, data, config.batch)?;
        let new: Vec<ProductShape> = m.timed().map(|(s, _)| *s).filter(|s| !timed.contains_key(s)).collect();
        let times = time_products(config, blas, false, &new);
        timed.extend(new.into_iter().zip(times));
        rows.push(report(&m, &timed));
    }
    println!("    the zoo's products, each model's shapes weighed by their calls:");
    println!(
        "| model | MFLOP a sample | shapes timed | oar GFLOP/s | reference GFLOP/s | oar / reference | least ratio |"
    );
    println!("|---|---|---|---|---|---|---|");
    for row in rows {
        println!("{row}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_are_picked_by_the_zoos_names_or_all() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let picked = pick(&names(&["DCN", "LR"])).unwrap();
        assert_eq!(picked.iter().map(|(n, _)| *n).collect::<Vec<_>>(), ["LR", "DCN"], "in the zoo's order");
        assert_eq!(pick(&names(&["all"])).unwrap().len(), ZOO.len());
        let e = pick(&names(&["ResNet"])).unwrap_err().to_string();
        assert!(e.contains("\"ResNet\"") && e.contains("DeepFM") && e.contains("all"), "{e}");
    }

    #[test]
    fn a_model_times_the_shapes_that_carry_a_percent_of_its_flops() {
        // 200 m FLOPs a call of shape(m).
        let shape = |m| ProductShape { m, n: 10, k: 10, a_transposed: false, b_transposed: false };
        let model = |shapes| ModelProducts { name: "x", samples: 1, shapes };
        // 99% of the FLOPs in 9,900 and 1% in 100: both timed.
        assert_eq!(model(vec![(shape(9_900), 1), (shape(100), 1)]).timed().count(), 2);
        // 0.99% in 99: counted, not timed.
        let m = model(vec![(shape(9_901), 1), (shape(99), 1)]);
        assert_eq!(m.timed().map(|(s, _)| s.m).collect::<Vec<_>>(), [9_901]);
        assert_eq!(m.flops(), 2_000_000.0);
    }
}
