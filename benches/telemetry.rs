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

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use tower::{Service, ServiceBuilder, service_fn};
use tower_llm::breaker::BreakerLayer;
use tower_llm::deadline::DeadlineLayer;
use tower_llm::fallback::{FallbackLayer, LinkSpec};
use tower_llm::retry::RetryLayer;
use tower_llm::{Failure, HttpClassifier, Metrics, ServiceBuilderExt};

mod support;
use support::{call, paired};

type Req = http::Request<()>;
type Res = http::Response<()>;

fn bare() -> impl Service<Req, Response = Res, Error = Failure, Future: Send> + Clone + Send + Sync
{
    service_fn(|_req: Req| std::future::ready(Ok(http::Response::new(()))))
}

/// The full stack, its per-call metrics recorded on `metrics`.
fn stack(metrics: Metrics) -> impl Service<Req, Response = Res, Error = Failure> {
    let breaker = BreakerLayer::http();
    let link = || {
        ServiceBuilder::new()
            .llm_retry(RetryLayer::http())
            .llm_breaker(breaker.clone())
            .service(bare())
    };
    let fallback = FallbackLayer::builder(LinkSpec::new("openai", "gpt-4o"))
        .or(LinkSpec::new("anthropic", "claude-sonnet-4-5"), link())
        .or(LinkSpec::new("bedrock", "nova-pro"), link())
        .with_classifier(HttpClassifier)
        .build()
        .expect("valid chain");
    ServiceBuilder::new()
        .layer(DeadlineLayer::new(Duration::from_secs(30)).with_metrics(metrics))
        .llm_fallback(fallback)
        .service(link())
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let _guard = rt.enter();
    let sdk = SdkMeterProvider::builder()
        .with_reader(
            opentelemetry_prometheus::exporter()
                .build()
                .expect("exporter"),
        )
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
