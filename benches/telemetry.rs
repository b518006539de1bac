//! What telemetry costs: the full stack (deadline → fallback with three
//! links → retry → breaker) around a service that answers at once, with
//! the per-call metrics off (`Metrics::disabled()`), on the global no-op
//! meter (no SDK installed: the default), and on an SDK meter provider
//! that aggregates them. No tracing subscriber is installed, so spans are
//! disabled, as in a host that does not collect them.
//!
//! ```text
//! cargo bench --bench telemetry
//! ```

use criterion::{Criterion, criterion_group, criterion_main};
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use tower::Service;
use tower_llm::breaker::BreakerLayer;
use tower_llm::{Failure, Metrics};

mod support;
use support::{Req, Res, bare, call, current_thread, full_stack, paired};

/// The full stack, its per-call metrics recorded on `metrics`.
/// An exporter that drops what it is given.
#[derive(Debug)]
struct Discard;

impl opentelemetry_sdk::metrics::exporter::PushMetricExporter for Discard {
    async fn export(
        &self,
        _metrics: &opentelemetry_sdk::metrics::data::ResourceMetrics,
    ) -> opentelemetry_sdk::error::OTelSdkResult {
        Ok(())
    }

    fn force_flush(&self) -> opentelemetry_sdk::error::OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(
        &self,
        _timeout: std::time::Duration,
    ) -> opentelemetry_sdk::error::OTelSdkResult {
        Ok(())
    }

    fn temporality(&self) -> opentelemetry_sdk::metrics::Temporality {
        opentelemetry_sdk::metrics::Temporality::Cumulative
    }
}

fn stack(metrics: Metrics) -> impl Service<Req, Response = Res, Error = Failure> {
    full_stack(BreakerLayer::http(), metrics)
}

fn bench(c: &mut Criterion) {
    let rt = current_thread();
    let _guard = rt.enter();
    let sdk = SdkMeterProvider::builder()
        // A reader that never exports (the bench measures recording).
        .with_reader(opentelemetry_sdk::metrics::PeriodicReader::builder(Discard).build())
        .build();

    let mut off = stack(Metrics::disabled());
    let mut noop = stack(Metrics::global());
    let mut recording = stack(Metrics::new(&sdk.meter("tower-llm")));
    let mut plain = bare();

    let (b, o) = paired(&mut plain, &mut off);
    println!("paired medians: bare {b:.0} ns, full stack with metrics off {o:.0} ns");
    let (o, n) = paired(&mut off, &mut noop);
    println!(
        "paired medians: metrics off {o:.0} ns, no-op meter {n:.0} ns: {:+.1} %",
        (n / o - 1.0) * 100.0
    );
    let (o, r) = paired(&mut off, &mut recording);
    println!(
        "paired medians: metrics off {o:.0} ns, SDK meter {r:.0} ns: {:+.1} %",
        (r / o - 1.0) * 100.0
    );

    let mut group = c.benchmark_group("telemetry");
    group.bench_function("bare", |bch| bch.iter(|| call(&mut plain)));
    group.bench_function("stack_metrics_off", |bch| bch.iter(|| call(&mut off)));
    group.bench_function("stack_noop_meter", |bch| bch.iter(|| call(&mut noop)));
    group.bench_function("stack_sdk_meter", |bch| bch.iter(|| call(&mut recording)));
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
