//! HTML building blocks of the dashboard: escaping, the page layout (one small style sheet, inline),
//! and how numbers, sizes, times and statuses read.

use std::fmt::Write as _;

use sonic_api::control::JobStatus;

/// Escapes text for HTML element content and attribute values (double-quoted).
pub fn esc(s: &str) -> String {
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

/// Percent-encodes a path segment or query value.
pub fn url(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// The style sheet: readable on a phone (tables scroll inside their box), contrast above 4.5:1,
/// statuses in words as well as colors, a visible focus ring.
const CSS: &str = r#"
*{box-sizing:border-box}
body{margin:0;font:16px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1a1a1a;background:#fff}
a{color:#0b57d0}a:focus,button:focus,input:focus,select:focus,textarea:focus{outline:3px solid #f2a900;outline-offset:2px}
.skip{position:absolute;left:-999px}.skip:focus{left:8px;top:8px;background:#fff;padding:4px}
header{background:#102a43;color:#fff}
header nav{display:flex;flex-wrap:wrap;gap:.25rem 1.25rem;align-items:center;max-width:100rem;margin:0 auto;padding:.6rem 1rem}
header a{color:#fff;text-decoration:none;font-weight:600}header a:hover{text-decoration:underline}
header .brand{font-size:1.2rem;margin-right:auto}
header form{margin:0}header button{background:none;border:1px solid #9fb3c8;color:#fff;border-radius:4px;padding:.1rem .6rem;cursor:pointer}
main{max-width:100rem;margin:0 auto;padding:1rem}
h1{font-size:1.6rem;margin:.5rem 0 1rem;word-break:break-all}h2{font-size:1.25rem;margin:1.75rem 0 .5rem;border-bottom:1px solid #d9e2ec}
h3{font-size:1.05rem;margin:1rem 0 .25rem}
.scroll{overflow-x:auto;max-width:100%}
table{border-collapse:collapse;margin:.25rem 0 1rem;font-size:.95rem}
th,td{padding:.3rem .6rem;border-bottom:1px solid #e4e7eb;text-align:left;vertical-align:top;white-space:nowrap}
td.wrap{white-space:normal;min-width:12rem}
th{background:#f0f4f8;font-weight:600}
.num{text-align:right;font-variant-numeric:tabular-nums}
.badge{display:inline-block;padding:0 .45rem;border-radius:.7rem;font-size:.85rem;font-weight:600;border:1px solid}
.s-succeeded,.ok{color:#0a5a2a;background:#e3f5e9;border-color:#0a5a2a}
.s-failed,.bad{color:#8a1c1c;background:#fde8e8;border-color:#8a1c1c}
.s-running{color:#0b3c8a;background:#e6efff;border-color:#0b3c8a}
.s-queued,.warn{color:#5c3d00;background:#fff4d6;border-color:#5c3d00}
.muted{color:#52606d}
.cards{display:flex;flex-wrap:wrap;gap:.75rem;margin:.5rem 0 1rem}
.card{border:1px solid #d9e2ec;border-radius:6px;padding:.5rem .9rem;min-width:9rem}
.card b{display:block;font-size:1.4rem}
.charts{display:flex;flex-wrap:wrap;gap:1rem}
figure{margin:0 0 1rem;border:1px solid #e4e7eb;border-radius:6px;padding:.5rem;max-width:100%}
figcaption{font-size:.9rem}
svg{max-width:100%;height:auto}svg.dag{display:block;margin:0 auto}
.charts figure{width:21.5rem}
caption{text-align:left;padding:0 .6rem}
form.inline{display:inline}
fieldset{border:1px solid #d9e2ec;border-radius:6px;margin:0 0 1rem;padding:.5rem 1rem 1rem;min-width:0}
label{display:block;font-weight:600;margin:.5rem 0 .15rem}
input,select,textarea{font:inherit;padding:.35rem .5rem;border:1px solid #52606d;border-radius:4px;max-width:100%}
.hint{font-size:.85rem;color:#52606d;margin:.1rem 0}
button.primary{background:#0b57d0;color:#fff;border:0;border-radius:4px;padding:.45rem 1rem;font:inherit;font-weight:600;cursor:pointer;margin-top:.75rem}
button.danger{background:#fff;color:#8a1c1c;border:1px solid #8a1c1c;border-radius:4px;padding:.3rem .8rem;font:inherit;cursor:pointer}
.error{border:2px solid #8a1c1c;background:#fde8e8;color:#8a1c1c;padding:.5rem 1rem;border-radius:6px}
pre{background:#f0f4f8;padding:.5rem;overflow-x:auto;font-size:.85rem;max-height:24rem}
details{margin:.25rem 0}summary{cursor:pointer}
meter{width:6rem}
code,dd,li,p{overflow-wrap:anywhere}
dl.facts{display:grid;grid-template-columns:max-content minmax(0,1fr);gap:.15rem 1rem;margin:0 0 1rem}dl.facts dt{font-weight:600}dl.facts dd{margin:0;min-width:0}
figure.tall{max-height:36rem;overflow-y:auto}
.wrap-text{white-space:normal;display:inline-block;min-width:16rem;max-width:40rem}
ul.results li{overflow-wrap:anywhere}
@media (max-width:40rem){body{font-size:15px}main{padding:.6rem}th,td{padding:.25rem .4rem}dl.facts{grid-template-columns:minmax(0,1fr)}dl.facts dd{margin-bottom:.35rem}.badge{white-space:nowrap}.cards .card{min-width:0;flex:1 1 8rem}}
"#;

/// A whole page: `title`, then `body` (already HTML) in the main landmark. `nav` adds the
/// navigation and the logout button (every page but the login page).
pub fn page(title: &str, body: &str, nav: bool) -> String {
    let mut out = String::with_capacity(body.len() + CSS.len() + 1024);
    out.push_str("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">");
    out.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">");
    let _ = write!(out, "<title>{} · Sonic</title>", esc(title));
    let _ = write!(out, "<style>{CSS}</style>");
    if nav {
        out.push_str("<script src=\"/assets/dashboard.js\" defer></script>");
    }
    out.push_str("</head><body><a class=\"skip\" href=\"#main\">Skip to the content</a><header>");
    if nav {
        out.push_str(
            "<nav aria-label=\"Main\"><a class=\"brand\" href=\"/\">Sonic</a>\
             <a href=\"/dags\">DAGs</a><a href=\"/jobs\">Jobs</a><a href=\"/agents\">Agents</a>\
             <form method=\"post\" action=\"/logout\"><button type=\"submit\">Log out</button></form></nav>",
        );
    } else {
        out.push_str("<nav aria-label=\"Main\"><span class=\"brand\">Sonic</span></nav>");
    }
    out.push_str("</header><main id=\"main\">");
    out.push_str(body);
    out.push_str("</main></body></html>\n");
    out
}

/// A job status as a badge: the word, in a color that is not the only cue.
pub fn status(s: JobStatus) -> String {
    format!(
        "<span class=\"badge s-{0}\" data-status=\"{0}\">{0}</span>",
        s.as_str()
    )
}

/// A job's status badge, a cancelled job's reading `cancelled` (its status is `failed`).
pub fn job_status(s: &sonic_api::control::JobSummary) -> String {
    if s.status == JobStatus::Failed && s.failure == Some(sonic_core::machine::Failure::Cancelled) {
        "<span class=\"badge s-failed\" data-status=\"failed\">cancelled</span>".to_owned()
    } else {
        status(s.status)
    }
}

/// A yes/no badge with words.
pub fn flag(ok: bool, yes: &str, no: &str) -> String {
    if ok {
        format!("<span class=\"badge ok\">{}</span>", esc(yes))
    } else {
        format!("<span class=\"badge warn\">{}</span>", esc(no))
    }
}

/// 1234567 bytes -> `1.2 MB`.
pub fn bytes(n: f64) -> String {
    let units = ["B", "KB", "MB", "GB", "TB"];
    let mut v = n;
    let mut u = 0;
    while v.abs() >= 1000.0 && u + 1 < units.len() {
        v /= 1000.0;
        u += 1;
    }
    if u == 0 {
        format!("{v:.0} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

/// Seconds, with a precision that suits their size.
pub fn secs(s: f64) -> String {
    if !s.is_finite() {
        "-".into()
    } else if s < 1.0 {
        format!("{:.0} ms", s * 1000.0)
    } else if s < 100.0 {
        format!("{s:.2} s")
    } else {
        format!("{s:.0} s")
    }
}

/// Dollars with enough digits for a job's cost.
pub fn usd(v: f64) -> String {
    if v == 0.0 {
        "$0".into()
    } else if v.abs() < 0.01 {
        format!("${v:.6}")
    } else {
        format!("${v:.4}")
    }
}

/// A number with three significant digits.
pub fn num(v: f64) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if (1e-3..1e6).contains(&a) {
        let digits = (2 - a.log10().floor() as i32).max(0) as usize;
        format!("{v:.digits$}")
    } else {
        format!("{v:.2e}")
    }
}

/// A fraction as a percentage.
pub fn pct(v: f64) -> String {
    if v.is_finite() {
        format!("{:.1}%", v * 100.0)
    } else {
        "-".into()
    }
}

/// A signed fraction as a percentage: `+12.0%`, `−3.5%`.
pub fn signed_pct(v: f64) -> String {
    if !v.is_finite() {
        "-".into()
    } else if v < 0.0 {
        format!("\u{2212}{:.1}%", -v * 100.0)
    } else {
        format!("+{:.1}%", v * 100.0)
    }
}

/// Unix milliseconds as UTC `2026-11-25 04:36:59`.
pub fn time(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// `<time>` of Unix milliseconds, with UTC named.
pub fn when(ms: i64) -> String {
    format!("<time>{} UTC</time>", time(ms))
}

/// A table with a caption, headers and rows of cells (already HTML), inside a scrolling box.
pub fn table(caption: &str, headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut out = String::from("<div class=\"scroll\"><table>");
    if !caption.is_empty() {
        let _ = write!(out, "<caption class=\"muted\">{}</caption>", esc(caption));
    }
    out.push_str("<thead><tr>");
    for h in headers {
        let class = if h.ends_with(' ') {
            " class=\"num\""
        } else {
            ""
        };
        let _ = write!(out, "<th scope=\"col\"{class}>{}</th>", esc(h.trim_end()));
    }
    out.push_str("</tr></thead><tbody>");
    for r in rows {
        out.push_str("<tr>");
        for (i, c) in r.iter().enumerate() {
            let num = headers.get(i).is_some_and(|h| h.ends_with(' '));
            if num {
                let _ = write!(out, "<td class=\"num\">{c}</td>");
            } else {
                let _ = write!(out, "<td>{c}</td>");
            }
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table></div>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_and_formats() {
        assert_eq!(
            esc("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
        assert_eq!(url("a b/c"), "a%20b%2Fc");
        assert_eq!(bytes(999.0), "999 B");
        assert_eq!(bytes(1_200_000.0), "1.2 MB");
        assert_eq!(secs(0.25), "250 ms");
        assert_eq!(secs(2.5), "2.50 s");
        assert_eq!(num(0.012345), "0.0123");
        assert_eq!(num(1234.6), "1235");
        assert_eq!(pct(0.153), "15.3%");
        assert_eq!(time(0), "1970-01-01 00:00:00");
        assert_eq!(time(1_764_045_419_000), "2025-11-25 04:36:59");
    }

    #[test]
    fn a_page_has_its_landmarks() {
        let p = page("fan <dag>", "<p>x</p>", true);
        assert!(p.starts_with("<!doctype html>"));
        assert!(p.contains("<html lang=\"en\">"));
        assert!(p.contains("<title>fan &lt;dag&gt; · Sonic</title>"));
        assert!(p.contains("<main id=\"main\"><p>x</p></main>"));
        assert!(p.contains("action=\"/logout\""));
        assert!(!page("Log in", "", false).contains("/logout"));
    }
}
