//! The timeline as one self-contained HTML page: inline SVG charts, no
//! script, no external file, so it opens offline in any browser and can be
//! attached to a bug report as is.
//!
//! ```text
//!  ┌ verdict ───────────────────────────────────────────────┐
//!  │ busy cores per stage, stacked (dashed line: workers)   │
//!  │ the training loop's wait, % of each interval           │
//!  │ rows/s delivered                                       │
//!  │ ready batches in the prefetch ring · memory reserved   │
//!  │ totals per stage                                       │
//!  └────────────────────────────────────────────────────────┘
//! ```

use std::fmt::Write;

use super::TimelineSample;
use super::verdict::{Verdict, rate};

const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 200.0;
const LEFT: f64 = 56.0;
const RIGHT: f64 = 12.0;
const TOP: f64 = 10.0;
const BOTTOM: f64 = 24.0;
/// Stage colours, in order of total busy time (the palette repeats).
const PALETTE: &[&str] = &[
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1",
    "#ff9da7", "#9c755f", "#bab0ac",
];

/// Renders the page.
pub(crate) fn render(
    title: &str,
    samples: &[TimelineSample],
    verdict: &Verdict,
    workers: usize,
) -> String {
    let stages = stages_by_total(samples);
    let mut html = String::new();
    let _ = write!(
        html,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>sqlfeed timeline</title><style>{STYLE}</style></head><body>\
         <h1>sqlfeed feed timeline</h1><p class=\"query\">{}</p>\
         <p id=\"verdict\">{}</p>",
        escape(title),
        escape(&verdict.to_string())
    );
    if samples.len() < 2 {
        html.push_str(
            "<p>Too few samples to draw (the feed ran for less than one interval).</p>",
        );
    } else {
        let end = samples[samples.len() - 1].t_s.max(1e-9);
        // Busy cores per stage in each interval, stacked.
        let mut layers: Vec<(String, Vec<f64>)> = stages
            .iter()
            .map(|stage| {
                let values = per_interval(samples, |s| {
                    s.busy_s.get(stage).copied().unwrap_or(0.0)
                });
                (stage.clone(), values)
            })
            .collect();
        layers.push((
            "convert".to_string(),
            per_interval(samples, |s| s.convert_s),
        ));
        let peak = (0..samples.len() - 1)
            .map(|i| layers.iter().map(|(_, v)| v[i]).sum::<f64>())
            .fold(workers as f64, f64::max);
        html.push_str("<h2>Busy cores per stage</h2>");
        stacked_chart(&mut html, samples, &layers, peak, end, Some(workers as f64));
        legend(&mut html, &layers);
        let wait: Vec<f64> = per_interval(samples, |s| s.wait_s)
            .into_iter()
            .map(|w| (w * 100.0).min(100.0))
            .collect();
        let rows = per_interval(samples, |s| s.rows as f64);
        let at_each = |value: fn(&TimelineSample) -> f64| -> Vec<f64> {
            samples[1..].iter().map(value).collect()
        };
        let ready = at_each(|s| s.ready_batches as f64);
        let memory = at_each(|s| s.memory_reserved as f64 / 1e6);
        for (heading, name, values, peak) in [
            (
                "The training loop waiting for data (% of each interval)",
                "wait",
                wait,
                Some(100.0),
            ),
            ("Rows per second delivered", "rows", rows, None),
            ("Batches ready in the prefetch ring", "ready", ready, None),
            ("Memory reserved (MB)", "memory", memory, None),
        ] {
            let _ = write!(html, "<h2>{heading}</h2>");
            let peak = peak.unwrap_or_else(|| values.iter().copied().fold(1.0, f64::max));
            stacked_chart(
                &mut html,
                samples,
                &[(name.to_string(), values)],
                peak,
                end,
                None,
            );
        }
    }
    totals(&mut html, samples, verdict);
    html.push_str("</body></html>\n");
    html
}

const STYLE: &str = "body{font:14px system-ui,sans-serif;margin:24px;color:#222}\
h1{font-size:20px}h2{font-size:15px;margin:18px 0 4px}\
.query{font-family:monospace;white-space:pre-wrap;color:#555}\
#verdict{font-size:16px;font-weight:600;background:#f3f6fa;padding:8px 12px;border-left:4px solid #4e79a7}\
.legend span{display:inline-block;margin-right:14px}\
.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-1px}\
table{border-collapse:collapse}td,th{padding:2px 10px;text-align:right}th{text-align:left}\
svg text{font-size:11px;fill:#555}";

/// Stages, busiest over the whole run first.
fn stages_by_total(samples: &[TimelineSample]) -> Vec<String> {
    let Some(last) = samples.last() else {
        return vec![];
    };
    let mut stages: Vec<(&String, &f64)> = last.busy_s.iter().collect();
    stages.sort_by(|a, b| b.1.total_cmp(a.1));
    stages.into_iter().map(|(stage, _)| stage.clone()).collect()
}

/// The rate of a cumulative quantity in each interval between samples.
fn per_interval(
    samples: &[TimelineSample],
    value: impl Fn(&TimelineSample) -> f64,
) -> Vec<f64> {
    samples
        .windows(2)
        .map(|pair| {
            let dt = (pair[1].t_s - pair[0].t_s).max(1e-9);
            ((value(&pair[1]) - value(&pair[0])) / dt).max(0.0)
        })
        .collect()
}

/// One chart of stacked step areas, a value per interval `[t_{i}, t_{i+1})`.
fn stacked_chart(
    html: &mut String,
    samples: &[TimelineSample],
    layers: &[(String, Vec<f64>)],
    peak: f64,
    end: f64,
    limit: Option<f64>,
) {
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let x = |t: f64| LEFT + t / end * plot_w;
    let y = |v: f64| TOP + plot_h - v / peak.max(1e-9) * plot_h;
    let _ = write!(
        html,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" \
         viewBox=\"0 0 {WIDTH} {HEIGHT}\">"
    );
    let intervals = samples.len() - 1;
    let mut base = vec![0.0; intervals];
    for (index, (name, values)) in layers.iter().enumerate() {
        let colour = PALETTE[index % PALETTE.len()];
        // Step edges: the top left to right, then the bottom back.
        let mut top = Vec::with_capacity(2 * intervals);
        let mut bottom = Vec::with_capacity(2 * intervals);
        for i in 0..intervals {
            let (t0, t1) = (samples[i].t_s, samples[i + 1].t_s);
            let high = base[i] + values[i];
            top.extend([(x(t0), y(high)), (x(t1), y(high))]);
            bottom.extend([(x(t0), y(base[i])), (x(t1), y(base[i]))]);
            base[i] = high;
        }
        let points: Vec<String> = top
            .into_iter()
            .chain(bottom.into_iter().rev())
            .map(|(px, py)| format!("{px:.1},{py:.1}"))
            .collect();
        let _ = write!(
            html,
            "<polygon class=\"layer\" data-layer=\"{}\" fill=\"{colour}\" points=\"{}\"/>",
            escape(name),
            points.join(" ")
        );
    }
    // Axes, ticks and the workers line.
    let _ = write!(
        html,
        "<line x1=\"{LEFT}\" y1=\"{0}\" x2=\"{1}\" y2=\"{0}\" stroke=\"#888\"/>\
         <line x1=\"{LEFT}\" y1=\"{TOP}\" x2=\"{LEFT}\" y2=\"{0}\" stroke=\"#888\"/>",
        TOP + plot_h,
        WIDTH - RIGHT
    );
    for tick in 0..=4 {
        let value = peak * tick as f64 / 4.0;
        let _ = write!(
            html,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            LEFT - 4.0,
            y(value) + 4.0,
            short(value)
        );
        let t = end * tick as f64 / 4.0;
        let _ = write!(
            html,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{t:.1} s</text>",
            x(t),
            HEIGHT - 6.0
        );
    }
    if let Some(limit) = limit {
        let _ = write!(
            html,
            "<line class=\"workers\" x1=\"{LEFT}\" y1=\"{0:.1}\" x2=\"{1}\" y2=\"{0:.1}\" \
             stroke=\"#222\" stroke-dasharray=\"4 3\"/>",
            y(limit),
            WIDTH - RIGHT
        );
    }
    html.push_str("</svg>");
}

fn legend(html: &mut String, layers: &[(String, Vec<f64>)]) {
    html.push_str("<div class=\"legend\">");
    for (index, (name, _)) in layers.iter().enumerate() {
        let _ = write!(
            html,
            "<span><i style=\"background:{}\"></i>{}</span>",
            PALETTE[index % PALETTE.len()],
            escape(name)
        );
    }
    html.push_str("<span>– – workers</span></div>");
}

fn totals(html: &mut String, samples: &[TimelineSample], verdict: &Verdict) {
    let Some(last) = samples.last() else {
        return;
    };
    html.push_str(
        "<h2>Totals</h2><table><tr><th>stage</th><th>busy s</th>\
         <th>share after the first batch</th></tr>",
    );
    let mut rows: Vec<(String, f64)> =
        last.busy_s.iter().map(|(s, b)| (s.clone(), *b)).collect();
    rows.push(("convert".into(), last.convert_s));
    rows.push(("h2d".into(), last.h2d_s));
    for (stage, busy) in rows {
        let _ = write!(
            html,
            "<tr><th>{}</th><td>{busy:.2}</td><td>{:.0}%</td></tr>",
            escape(&stage),
            verdict.busy_of(&stage) * 100.0
        );
    }
    let _ = write!(
        html,
        "</table><p>{} rows in {:.2} s; the loop waited {:.2} s, the producer waited for \
         free slots {:.2} s; {:.1} MB scanned, {:.1} MB spilled; rows/s after the first \
         batch: {}.</p>",
        last.rows,
        last.t_s,
        last.wait_s,
        last.stall_s,
        last.bytes_scanned as f64 / 1e6,
        last.spilled_bytes as f64 / 1e6,
        rate(verdict.rows_per_s)
    );
}

fn short(value: f64) -> String {
    if value >= 1e6 {
        format!("{:.1}M", value / 1e6)
    } else if value >= 1e3 {
        format!("{:.1}k", value / 1e3)
    } else if value >= 10.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.2}")
    }
}

/// Text made safe for HTML.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::feed::timeline::verdict::Bound;

    fn sample(t_s: f64, decode_s: f64, rows: u64) -> TimelineSample {
        TimelineSample {
            t_s,
            busy_s: BTreeMap::from([("image_decode".to_string(), decode_s)]),
            rows,
            wait_s: 0.0,
            convert_s: 0.0,
            h2d_s: 0.0,
            stall_s: 0.0,
            bytes_scanned: 0,
            spilled_bytes: 0,
            ready_batches: 2,
            memory_reserved: 1 << 20,
        }
    }

    #[test]
    fn the_page_is_one_file_with_the_verdict_and_a_layer_per_stage() {
        let samples = [
            sample(0.0, 0.0, 0),
            sample(1.0, 1.5, 500),
            sample(2.0, 3.5, 1500),
        ];
        let verdict = Verdict {
            bound: Bound::Stage("image_decode".into()),
            rows_per_s: 1000.0,
            wait_frac: 0.4,
            busy_frac: vec![("image_decode".into(), 0.9)],
            window_s: 1.0,
            workers: 2,
        };
        let html = render("SELECT <x> & 'y'", &samples, &verdict, 2);
        assert!(
            html.contains("SELECT &lt;x&gt; &amp; &#39;y&#39;"),
            "escaped title"
        );
        assert!(html.contains(&format!("<p id=\"verdict\">{verdict}</p>")));
        assert!(html.contains("data-layer=\"image_decode\""));
        // Nothing outside the file: no script, stylesheet or image link.
        for outside in ["<script", "src=", "href=", "@import"] {
            assert!(!html.contains(outside), "{outside}");
        }
        // The second interval's decode rate is 2 cores: its top edge is at
        // the top of the chart (peak = max(workers, stacked) = 2).
        assert!(html.contains(&format!(
            "{:.1},{:.1}",
            LEFT + (WIDTH - LEFT - RIGHT),
            TOP
        )));
    }
}
