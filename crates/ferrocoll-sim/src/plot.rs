//! A hand-written SVG chart of a run's link utilization over time
//! ([`SimResult::timeline`]): one line per link class, time in
//! microseconds across, utilization up. The output depends only on the
//! result and the title (fixed size, colours and number formats), so two
//! runs of the same simulation give the same bytes.

use std::fmt::Write;

use crate::SimResult;

/// Chart size and plot area margins, in SVG user units.
const WIDTH: f64 = 800.0;
const HEIGHT: f64 = 420.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 180.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 52.0;

/// Line colours, one per class in order (repeating after ten).
const COLOURS: [&str; 10] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

/// `s` with the characters XML gives meaning to escaped.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

/// A tick label: at most three significant decimals, no trailing zeros.
fn label(v: f64) -> String {
    let s = if v == 0.0 {
        "0".to_string()
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else if v.abs() >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    };
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// The utilization timeline of `result` as an SVG document: one
/// `<polyline>` per link class (a point at the middle of each bucket), x =
/// time in microseconds from 0 to `result.time_s`, y = utilization from 0
/// to 1 (higher when a bucket exceeds 1, as the ideal mode's middle links
/// can), five ticks on each axis, `title` above and a legend of the
/// classes on the right.
pub fn svg(result: &SimResult, title: &str) -> String {
    let (pw, ph) = (WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM);
    let t_us = result.time_s * 1e6;
    let peak = result
        .timeline
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .filter(|v| v.is_finite())
        .fold(1.0f64, f64::max);
    // Round the top of the y axis up to a quarter.
    let ymax = ((peak - 1e-9) * 4.0).ceil() / 4.0;
    let x = |t: f64| LEFT + if t_us > 0.0 { t / t_us * pw } else { 0.0 };
    let y = |u: f64| TOP + ph - u.clamp(0.0, ymax) / ymax * ph;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        s,
        r#"<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="white"/>"#
    );
    let _ = writeln!(
        s,
        // Anchored at the left edge: long titles (topology strings) would
        // run off the left of the picture if centred.
        r#"<text x="8" y="24" font-size="13">{}</text>"#,
        escape(title)
    );
    // Grid, ticks and labels.
    for i in 0..=4 {
        let f = f64::from(i) / 4.0;
        let (gx, gy) = (LEFT + f * pw, TOP + ph - f * ph);
        let _ = writeln!(
            s,
            r##"<line x1="{gx:.1}" y1="{TOP:.1}" x2="{gx:.1}" y2="{:.1}" stroke="#e0e0e0"/>"##,
            TOP + ph + 4.0
        );
        let _ = writeln!(
            s,
            r#"<text x="{gx:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            TOP + ph + 18.0,
            label(f * t_us)
        );
        let _ = writeln!(
            s,
            r##"<line x1="{:.1}" y1="{gy:.1}" x2="{:.1}" y2="{gy:.1}" stroke="#e0e0e0"/>"##,
            LEFT - 4.0,
            LEFT + pw
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            LEFT - 8.0,
            gy + 4.0,
            label(f * ymax)
        );
    }
    // The axes are a path, so that every `<polyline` is a class.
    let _ = writeln!(
        s,
        r#"<path d="M{LEFT:.1},{TOP:.1} V{:.1} H{:.1}" fill="none" stroke="black"/>"#,
        TOP + ph,
        LEFT + pw
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">time (us)</text>"#,
        LEFT + pw / 2.0,
        HEIGHT - 12.0
    );
    let _ = writeln!(
        s,
        r#"<text x="16" y="{:.1}" text-anchor="middle" transform="rotate(-90 16 {:.1})">utilization</text>"#,
        TOP + ph / 2.0,
        TOP + ph / 2.0
    );
    // One line per class, and its legend entry.
    for (c, (class, values)) in result.timeline.iter().enumerate() {
        let colour = COLOURS[c % COLOURS.len()];
        let nb = values.len().max(1) as f64;
        let mut points = String::new();
        for (i, &u) in values.iter().enumerate() {
            let t = (i as f64 + 0.5) / nb * t_us;
            let u = if u.is_finite() { u } else { 0.0 };
            if i > 0 {
                points.push(' ');
            }
            let _ = write!(points, "{:.1},{:.1}", x(t), y(u));
        }
        let _ = writeln!(
            s,
            r#"<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="1.5"><title>{}</title></polyline>"#,
            escape(class)
        );
        let ly = TOP + 10.0 + c as f64 * 18.0;
        let lx = LEFT + pw + 16.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{colour}" stroke-width="3"/>"#,
            lx + 20.0
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}">{}</text>"#,
            lx + 26.0,
            ly + 4.0,
            escape(class)
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{simulate, LinkClassStats, Mode, TopologySpec};
    use ferrocoll::{Algorithm, Collective};

    fn result() -> SimResult {
        let t =
            TopologySpec::parse("fat-tree:ranks=16,leaf=4,bw=50GB/s,lat=1us,oversub=2").unwrap();
        simulate(
            Collective::AllToAll,
            Algorithm::Direct,
            16 << 20,
            &t,
            Mode::Contention,
        )
        .unwrap()
    }

    #[test]
    fn one_polyline_per_class_and_the_same_bytes_twice() {
        let r = result();
        let a = svg(&r, "alltoall <fat-tree> & more");
        assert_eq!(r.timeline.len(), 4);
        assert_eq!(a.matches("<polyline").count(), r.timeline.len());
        for (class, _) in &r.timeline {
            assert!(a.contains(&format!("<title>{class}</title>")), "{class}");
        }
        assert!(a.starts_with("<svg") && a.ends_with("</svg>\n"));
        assert!(a.contains("alltoall &lt;fat-tree&gt; &amp; more"));
        assert!(a.contains("time (us)"));
        assert_eq!(a, svg(&result(), "alltoall <fat-tree> & more"));
    }

    #[test]
    fn points_stay_inside_the_plot() {
        let r = SimResult {
            time_s: 2e-3,
            algbw: 0.0,
            busbw: 0.0,
            per_class: vec![LinkClassStats {
                class: "up".into(),
                bytes: 0,
                utilization: 0.5,
            }],
            hottest_link: String::new(),
            events: 0,
            timeline: vec![("up".into(), vec![0.0, 0.5, 1.0, 0.25])],
            aggregated: None,
            uneven: None,
            critical_path: Default::default(),
        };
        let s = svg(&r, "t");
        let line = s.lines().find(|l| l.starts_with("<polyline")).unwrap();
        let points = line.split('"').nth(1).unwrap();
        let xy: Vec<(f64, f64)> = points
            .split(' ')
            .map(|p| {
                let (a, b) = p.split_once(',').unwrap();
                (a.parse().unwrap(), b.parse().unwrap())
            })
            .collect();
        assert_eq!(xy.len(), 4);
        for (px, py) in &xy {
            assert!((LEFT..=WIDTH - RIGHT).contains(px) && (TOP..=HEIGHT - BOTTOM).contains(py));
        }
        // Utilization 1 is the top of the plot, 0 its bottom.
        assert_eq!(xy[2].1, TOP);
        assert_eq!(xy[0].1, HEIGHT - BOTTOM);
        // The x ticks end at the run's 2000 us.
        assert!(s.contains(">2000</text>"), "{s}");
        assert_eq!(label(0.125), "0.125");
        assert_eq!(label(1.5), "1.5");
        assert_eq!(label(250.0), "250");
    }
}
