//! `GET /status`: the page for operators, rendered from the board, the
//! circuits and the running policy.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use tower_llm::breaker::CircuitState;

use crate::Gateway;

use super::board::{MINUTES, Quantiles, Window};

/// HTML-escapes `s` (text and attribute values).
pub(crate) fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A sparkline of the p50 (solid) and p99 (dashed) of each minute, on a
/// log scale from 1 ms to 60 s.
fn sparkline(points: &[Quantiles; MINUTES], label: &str) -> String {
    const W: f64 = 150.0;
    const H: f64 = 32.0;
    let y = |ms: f64| {
        let t = (ms.max(1.0).log10() / 60_000f64.log10()).clamp(0.0, 1.0);
        H - 2.0 - t * (H - 4.0)
    };
    let x = |i: usize| 2.0 + i as f64 * (W - 4.0) / (MINUTES - 1) as f64;
    let line = |pick: fn(&Quantiles) -> Option<f64>| {
        let mut d = String::new();
        let mut pen_down = false;
        for (i, p) in points.iter().enumerate() {
            match pick(p) {
                Some(v) => {
                    let _ = write!(
                        d,
                        "{}{:.1},{:.1} ",
                        if pen_down { "L" } else { "M" },
                        x(i),
                        y(v)
                    );
                    pen_down = true;
                }
                None => pen_down = false,
            }
        }
        d
    };
    let last = points.iter().rev().find_map(|p| p.0.zip(p.1));
    // The latest minute's p50 as a dot (a lone minute draws no line).
    let dot = points
        .iter()
        .enumerate()
        .rev()
        .find_map(|(i, p)| p.0.map(|v| (x(i), y(v))))
        .map_or(String::new(), |(cx, cy)| {
            format!("<circle cx=\"{cx:.1}\" cy=\"{cy:.1}\" r=\"2.5\" fill=\"#2471a3\"/>")
        });
    let caption = match last {
        Some((p50, p99)) => format!("{label} p50 {p50:.0} ms, p99 {p99:.0} ms"),
        None => format!("{label}: no answers"),
    };
    format!(
        "<svg class=\"spark\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" role=\"img\" aria-label=\"{}\"><title>{}</title>\
<path d=\"{}\" fill=\"none\" stroke=\"#2471a3\" stroke-width=\"1.5\"/>\
<path d=\"{}\" fill=\"none\" stroke=\"#c0392b\" stroke-width=\"1\" stroke-dasharray=\"3 2\"/>{dot}</svg>\
<div class=\"cap\">{}</div>",
        escape(&caption),
        escape(&caption),
        line(|p| p.0),
        line(|p| p.1),
        escape(&caption)
    )
}

/// A time `d` from now as UTC `HH:MM:SS`.
fn clock_in(d: Duration) -> String {
    let at = SystemTime::now() + d;
    let secs = at.duration_since(UNIX_EPOCH).map_or(0, |t| t.as_secs());
    format!(
        "{:02}:{:02}:{:02} UTC",
        (secs / 3600) % 24,
        (secs / 60) % 60,
        secs % 60
    )
}

impl Gateway {
    /// The status page, rendered now. `operator`: the page is for someone
    /// who presented the admin token (it then carries the manual-control
    /// buttons).
    pub(crate) fn render_status(&self, operator: bool) -> String {
        let policy = self.policy();
        let circuits = self.breaker().snapshot();
        let probes = self.probes();
        let now = self.status.minute();
        let families = self.registry.gather();
        let spend = spend_by_link(&families);
        let mut page = String::with_capacity(16 << 10);
        page.push_str("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">");
        if !operator {
            // An operator's page does not refresh itself: a reload would not
            // present the token again, and its buttons would go.
            page.push_str("<meta http-equiv=\"refresh\" content=\"5\">");
        }
        page.push_str(
            "<title>tower-llm gateway status</title><style>\
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}\
table{border-collapse:collapse;margin-bottom:1.5em}td,th{border:1px solid #ccc;padding:.3em .6em;vertical-align:top;text-align:left}\
.closed{color:#1e8449}.open,.isolated{color:#c0392b;font-weight:bold}.half_open{color:#b9770e;font-weight:bold}\
.banner{background:#fdecea;border:1px solid #c0392b;padding:.6em;margin-bottom:1em}\
.cap{font-size:.75em;color:#555}.num{text-align:right}button{margin:.1em}\
</style></head><body><h1>Gateway status</h1>",
        );
        if let Some(error) = self.reload_error.load_full() {
            let _ = write!(
                page,
                "<div class=\"banner\" id=\"reload-error\"><strong>The last policy reload failed</strong>; the running policy stays: {}</div>",
                escape(&error)
            );
        }
        for route in &policy.routes {
            let _ = write!(
                page,
                "<h2>Route <code>{}</code></h2><table><tr><th>#</th><th>link</th><th>circuit</th><th>last probe</th>\
<th>attempts 1 / 5 / 15 min</th><th>failures 1 / 5 / 15 min</th><th>failovers 1 / 5 / 15 min</th><th>errors (15 min)</th>\
<th>latency</th><th>time to first token</th><th>spend since start</th>{}</tr>",
                escape(&route.model),
                if operator { "<th>control</th>" } else { "" }
            );
            for (i, link) in route.chain.iter().enumerate() {
                let circuit = circuits
                    .iter()
                    .find(|c| c.key.provider() == link.provider && c.key.model() == link.model);
                let state = match circuit {
                    None => "<span class=\"closed\">closed</span>".to_owned(),
                    Some(c) => {
                        let label = c.state.as_metric_label();
                        let until = match (c.state, c.retry_after) {
                            (CircuitState::Open, Some(d)) => format!(" until {}", clock_in(d)),
                            _ => String::new(),
                        };
                        let label = label.replace('_', "-");
                        let streak = match c.state {
                            CircuitState::Closed => {
                                format!(" ({} failures in a row)", c.consecutive_failures)
                            }
                            _ => String::new(),
                        };
                        format!(
                            "<span class=\"{}\">{}{}</span>{streak}",
                            escape(c.state.as_metric_label()),
                            escape(&label),
                            escape(&until),
                        )
                    }
                };
                let probe = match probes.get(&link.provider) {
                    None => "not probed".to_owned(),
                    Some(p) if p.ok => format!("up ({} ms)", p.latency_ms),
                    Some(p) => format!(
                        "<span class=\"open\">down</span>: {}",
                        escape(
                            &p.error
                                .clone()
                                .or(p.status.map(|s| format!("HTTP {s}")))
                                .unwrap_or_default()
                        )
                    ),
                };
                let (windows, series) = self.status.read(&link.provider, &link.model, now);
                let triple = |f: fn(&Window) -> u64| {
                    format!(
                        "{} / {} / {}",
                        f(&windows[0]),
                        f(&windows[1]),
                        f(&windows[2])
                    )
                };
                let classes = if windows[2].classes.is_empty() {
                    "none".to_owned()
                } else {
                    windows[2]
                        .classes
                        .iter()
                        .map(|(c, n)| format!("{} {n}", escape(c)))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                let control = if operator {
                    let args = format!(
                        "'{}','{}'",
                        escape(&js_string(&link.provider)),
                        escape(&js_string(&link.model))
                    );
                    format!(
                        "<td><button onclick=\"ctl('open',{args})\">force open</button>\
<button onclick=\"ctl('close',{args})\">force close</button><button onclick=\"ctl('reset',{args})\">reset</button></td>"
                    )
                } else {
                    String::new()
                };
                let _ = write!(
                    page,
                    "<tr><td>{i}</td><td><code>{}</code> / <code>{}</code></td><td>{state}</td><td>{probe}</td>\
<td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td>{classes}</td><td>{}</td><td>{}</td><td class=\"num\">{}</td>{control}</tr>",
                    escape(&link.provider),
                    escape(&link.model),
                    triple(|w| w.attempts),
                    triple(|w| w.failures),
                    triple(|w| w.failovers),
                    sparkline(&series.latency, "latency"),
                    sparkline(&series.ttft, "time to first token"),
                    match (
                        policy.price(&link.provider, &link.model),
                        spend.get(&(link.provider.as_str(), link.model.as_str()))
                    ) {
                        (None, _) => "not priced".to_owned(),
                        (Some(_), spent) => format!("${:.6}", spent.copied().unwrap_or(0.0)),
                    },
                );
            }
            page.push_str("</table>");
        }
        self.render_pools(&policy, &mut page);
        if operator {
            // The token stays in the page of the operator who presented it
            // (the page is never cached); the buttons post to
            // /health/circuits with it.
            page.push_str(
                "<script>function ctl(a,p,m){fetch('/health/circuits',{method:'POST',headers:{'content-type':'application/json',\
'authorization':document.body.dataset.auth},body:JSON.stringify({action:a,provider:p,model:m})}).then(()=>location.reload())}</script>",
            );
        }
        let _ = write!(
            page,
            "<p class=\"cap\">Rendered {}{}. Sparklines: p50 (solid) and p99 (dashed) per minute, last 15 minutes, log scale 1 ms to 60 s.</p></body></html>",
            clock_in(Duration::ZERO),
            if operator {
                " (reload the page to refresh it)"
            } else {
                "; refreshes every 5 s"
            }
        );
        page
    }
}

impl Gateway {
    /// One table per `[[pools]]` entry: each deployment's load as the
    /// pool sees it.
    fn render_pools(&self, policy: &tower_llm::config::Policy, page: &mut String) {
        let statuses = self.pacers.statuses();
        for pool in &policy.pools {
            let Some((_, status)) = statuses.iter().find(|(name, _)| *name == pool.name) else {
                continue;
            };
            let _ = write!(
                page,
                "<h2>Pool <code>{}</code></h2><table><tr><th>deployment</th><th>weight</th><th>in flight</th>\
<th>latency (moving average)</th><th>failures (moving average)</th><th>cooling</th><th>rate limits left</th><th>concurrency limit</th></tr>",
                escape(&pool.name)
            );
            for d in status.deployments() {
                let _ = write!(
                    page,
                    "<tr><td><code>{}</code></td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
<td class=\"num\">{:.0} ms</td><td class=\"num\">{:.0} %</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    escape(&d.name),
                    d.weight,
                    d.load.in_flight,
                    d.load.latency_ms,
                    d.load.failure_rate * 100.0,
                    d.cooling_for
                        .map_or_else(|| "no".to_owned(), |c| format!("for {} ms", c.as_millis())),
                    pacing_text(d.pacing.as_ref()),
                    d.load
                        .concurrency_limit
                        .map_or_else(|| "off".to_owned(), |l| format!("{:.0}", l.floor())),
                );
            }
            page.push_str("</table>");
        }
    }
}

/// A pacer's buckets, for the page: requests and tokens left of the
/// per-minute limits in force.
fn pacing_text(pacing: Option<&tower_llm::pool::PaceSnapshot>) -> String {
    let Some(p) = pacing else {
        return "not paced".to_owned();
    };
    let part = |left: Option<u64>, limit: Option<u32>, what: &str| match (left, limit) {
        (Some(left), Some(limit)) => Some(format!("{left} / {limit} {what}")),
        _ => None,
    };
    let parts: Vec<String> = [
        part(p.requests, p.limits.rpm, "requests"),
        part(p.tokens, p.limits.tpm, "tokens"),
    ]
    .into_iter()
    .flatten()
    .collect();
    if parts.is_empty() {
        "no limit known".to_owned()
    } else {
        parts.join(", ")
    }
}

/// What each priced link has cost since the gateway started, in dollars
/// (`ai_router_cost_total` by provider and model; streams included, as
/// each settles when it ends).
fn spend_by_link(
    families: &[prometheus::proto::MetricFamily],
) -> std::collections::HashMap<(&str, &str), f64> {
    let mut spend = std::collections::HashMap::new();
    for family in families
        .iter()
        .filter(|f| f.name() == "ai_router_cost_total")
    {
        for metric in family.get_metric() {
            let label = |name: &str| {
                metric
                    .get_label()
                    .iter()
                    .find(|l| l.name() == name)
                    .map(|l| l.value())
            };
            if let (Some(provider), Some(model)) = (label("provider"), label("model")) {
                *spend.entry((provider, model)).or_insert(0.0) += metric.get_counter().get_value();
            }
        }
    }
    spend
}

/// `s` as the inside of a single-quoted JavaScript string (then
/// HTML-escaped for the attribute it sits in).
fn js_string(s: &str) -> String {
    s.chars()
        .flat_map(|c| match c {
            '\\' => vec!['\\', '\\'],
            '\'' => vec!['\\', '\''],
            c if c.is_control() => vec![' '],
            c => vec![c],
        })
        .collect()
}

/// `GET /status`.
pub(crate) async fn page(State(gw): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    let presented = crate::admin::bearer(&headers);
    let operator = match (gw.admin_token.load_full(), presented) {
        (Some(token), Some(offered)) => token.matches(offered),
        _ => false,
    };
    let mut html = gw.render_status(operator);
    if operator {
        if let Some(offered) = presented {
            // For the buttons' script: `data-auth` on the body. It matched
            // the token (a `String`), so it is UTF-8.
            let offered = String::from_utf8_lossy(offered);
            html = html.replacen(
                "<body>",
                &format!("<body data-auth=\"Bearer {}\">", escape(&offered)),
                1,
            );
        }
    }
    let mut res = html.into_response();
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        "content-security-policy",
        HeaderValue::from_static("default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:"),
    );
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_covers_text_and_attributes() {
        assert_eq!(
            escape(r#"<script>alert("x") & 'y'</script>"#),
            "&lt;script&gt;alert(&quot;x&quot;) &amp; &#39;y&#39;&lt;/script&gt;"
        );
    }
}
