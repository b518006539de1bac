//! Reading the tower-llm metrics back through OpenTelemetry's Prometheus
//! exporter, shared by `telemetry.rs` and `traces/propagation.rs`.

#![allow(dead_code)]

use opentelemetry_sdk::metrics::SdkMeterProvider;

/// A meter provider exporting to a Prometheus registry of its own.
pub(crate) fn prometheus() -> (SdkMeterProvider, prometheus::Registry) {
    let registry = prometheus::Registry::new();
    let exporter = opentelemetry_prometheus::exporter()
        .with_registry(registry.clone())
        .build()
        .expect("exporter");
    let provider = SdkMeterProvider::builder().with_reader(exporter).build();
    (provider, registry)
}

pub(crate) fn scrape(registry: &prometheus::Registry) -> String {
    prometheus::TextEncoder::new()
        .encode_to_string(&registry.gather())
        .expect("text")
}

/// The sum of the samples named `name` whose labels include `labels`.
pub(crate) fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (metric, rest) = match series.split_once('{') {
                Some((m, rest)) => (m, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            if metric != name {
                return None;
            }
            let all = labels
                .iter()
                .all(|(k, v)| rest.split(',').any(|pair| pair == format!("{k}=\"{v}\"")));
            all.then(|| value.parse::<f64>().ok()).flatten()
        })
        .sum()
}
