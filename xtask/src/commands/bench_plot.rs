//! The plot of `cargo xtask bench`, drawn on the host from `bench.json`: per
//! tool and size, the Rust/C time ratio with its 95% interval, a line at 1.0,
//! coloured by verdict; as PNG and SVG.
//!
//! Text is drawn with `ab_glyph` from a TrueType file found at run time
//! (`XTASK_PLOT_FONT`, else DejaVu Sans where Debian and others put it, else
//! what `fc-match` names), so the build needs no fontconfig or freetype.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

use crate::error::{Context, Error, Result};
use crate::json::Json;

/// One row of the plot.
#[derive(Clone, Debug, PartialEq)]
pub struct PlotRow {
    /// `tool size`.
    pub label: String,
    /// Rust/C time ratio.
    pub ratio: f64,
    /// Interval, low end.
    pub lo: f64,
    /// Interval, high end.
    pub hi: f64,
    /// "faster", "slower" or "same within noise".
    pub verdict: String,
}

/// The rows of a `bench.json` that have a ratio and an interval.
pub fn rows_of(doc: &Json) -> Vec<PlotRow> {
    let results = doc.get("results").and_then(Json::as_array).unwrap_or(&[]);
    results
        .iter()
        .filter_map(|r| {
            let n = |k: &str| r.get(k).and_then(Json::as_f64);
            Some(PlotRow {
                label: format!("{} {}", r.get("tool")?.as_str()?, size_label(n("size")?)),
                ratio: n("ratio")?,
                lo: n("ci_low")?,
                hi: n("ci_high")?,
                verdict: r.get("verdict")?.as_str()?.to_string(),
            })
        })
        .collect()
}

/// A size as people write it: 2, 64, 4K, 64K, 1M.
fn size_label(bytes: f64) -> String {
    let b = bytes as u64;
    match b {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}M", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}K", b >> 10),
        b => b.to_string(),
    }
}

/// Registers a sans-serif font with plotters, once.
fn ensure_font() -> Result<()> {
    static FONT: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    FONT.get_or_init(|| {
        let path = font_path().ok_or_else(|| {
            "no TrueType font for the plot: install fonts-dejavu-core, or set XTASK_PLOT_FONT \
             to a .ttf file"
                .to_string()
        })?;
        let bytes = fs::read(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        // plotters keeps fonts for the life of the program.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        register_font("sans-serif", FontStyle::Normal, bytes)
            .map_err(|_| format!("{} is not a font plotters can use", path.display()))
    })
    .clone()
    .map_err(Error::new)
}

/// The font file to use (see the module's documentation).
fn font_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("XTASK_PLOT_FONT") {
        return Some(PathBuf::from(p));
    }
    let known = [
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/TTF/DejaVuSans.ttf",
        "/usr/share/fonts/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    ];
    if let Some(p) = known.iter().map(PathBuf::from).find(|p| p.is_file()) {
        return Some(p);
    }
    let out = std::process::Command::new("fc-match")
        .args(["-f", "%{file}", "sans-serif:fontformat=TrueType"])
        .output()
        .ok()?;
    let p = PathBuf::from(String::from_utf8(out.stdout).ok()?);
    p.is_file().then_some(p)
}

/// The colour of a verdict.
fn colour(verdict: &str) -> RGBColor {
    match verdict {
        "faster" => RGBColor(0, 140, 60),
        "slower" => RGBColor(200, 30, 30),
        _ => RGBColor(90, 90, 90),
    }
}

/// Draws the chart on `root`.
fn draw<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, rows: &[PlotRow]) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| Error::new(format!("drawing the plot: {e}"));
    root.fill(&WHITE).map_err(err)?;
    let lo = rows.iter().map(|r| r.lo).fold(1.0_f64, f64::min);
    let hi = rows.iter().map(|r| r.hi).fold(1.0_f64, f64::max);
    let pad = ((hi - lo) * 0.08).max(0.02);
    let n = rows.len() as i32;
    let mut chart = ChartBuilder::on(root)
        .caption(
            "Rust/C time ratio, 95% interval (below 1: Rust faster)",
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(150)
        .build_cartesian_2d((lo - pad)..(hi + pad), -1..n)
        .map_err(err)?;
    let label = |y: &i32| {
        usize::try_from(n - 1 - *y)
            .ok()
            .and_then(|i| rows.get(i))
            .map_or(String::new(), |r| r.label.clone())
    };
    chart
        .configure_mesh()
        .y_labels(rows.len() + 2)
        .y_label_formatter(&label)
        .x_desc(
            "Rust time / C time (bandwidth rows: C rate / Rust rate); \
             green: faster, red: slower, grey: same within noise",
        )
        .light_line_style(WHITE)
        .draw()
        .map_err(err)?;
    chart
        .draw_series(LineSeries::new(
            [(1.0, -1), (1.0, n)],
            BLACK.stroke_width(1),
        ))
        .map_err(err)?;
    chart
        .draw_series(rows.iter().enumerate().map(|(i, r)| {
            let style = colour(&r.verdict).filled().stroke_width(2);
            ErrorBar::new_horizontal(n - 1 - i as i32, r.lo, r.ratio, r.hi, style, 8)
        }))
        .map_err(err)?;
    root.present().map_err(err)
}

/// The size of the picture for `n` rows.
fn size(n: usize) -> (u32, u32) {
    (1000, 120 + 24 * n.max(1) as u32)
}

/// Writes `dir/bench.png` and `dir/bench.svg` from `rows`; returns their paths.
pub fn plot(rows: &[PlotRow], dir: &Path) -> Result<Vec<PathBuf>> {
    ensure_font()?;
    let (w, h) = size(rows.len());
    let svg = dir.join("bench.svg");
    {
        let root = SVGBackend::new(&svg, (w, h)).into_drawing_area();
        draw(&root, rows)?;
    }
    let mut pixels = vec![0u8; (w * h * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut pixels, (w, h)).into_drawing_area();
        draw(&root, rows)?;
    }
    let png = dir.join("bench.png");
    let file = fs::File::create(&png).context(format!("creating {}", png.display()))?;
    let mut enc = png::Encoder::new(std::io::BufWriter::new(file), w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    enc.write_header()
        .and_then(|mut wr| wr.write_image_data(&pixels))
        .context(format!("writing {}", png.display()))?;
    Ok(vec![png, svg])
}

/// Reads a `bench.json` and writes the plot into `dir`.
pub fn plot_file(json: &Path, dir: &Path) -> Result<Vec<PathBuf>> {
    let text = fs::read_to_string(json).context(format!("reading {}", json.display()))?;
    let doc = Json::parse(&text).map_err(|e| Error::new(format!("{}: {e}", json.display())))?;
    let control = doc.get("method").and_then(|m| m.get("control"));
    if control.and_then(Json::as_bool) == Some(true) {
        return Err(Error::new(format!(
            "{}: a control run (C against C) has no Rust/C ratio to plot",
            json.display()
        )));
    }
    plot(&rows_of(&doc), dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURE: &str = r#"{"method": {}, "results": [
      {"tool": "ib_write_bw", "size": 65536, "ratio": 0.9, "ci_low": 0.85, "ci_high": 0.97, "verdict": "faster"},
      {"tool": "ib_send_lat", "size": 2, "ratio": 1.02, "ci_low": 0.95, "ci_high": 1.1, "verdict": "same within noise"},
      {"tool": "ib_read_lat", "size": 1048576, "ratio": 1.3, "ci_low": 1.2, "ci_high": 1.45, "verdict": "slower"},
      {"tool": "ibv_rc_pingpong", "size": 64, "ratio": null, "ci_low": null, "ci_high": null, "verdict": "no data"}
    ], "kiara": []}"#;

    #[test]
    fn rows_and_labels_from_json() {
        let rows = rows_of(&Json::parse(FIXTURE).unwrap());
        let labels: Vec<&str> = rows.iter().map(|r| r.label.as_str()).collect();
        assert_eq!(
            labels,
            ["ib_write_bw 64K", "ib_send_lat 2", "ib_read_lat 1M"]
        );
        assert_eq!(rows[2].hi, 1.45);
        assert_eq!(size_label(4096.0), "4K");
        assert_ne!(colour("faster"), colour("slower"));
    }

    #[test]
    fn the_plot_is_written_from_a_fixture() {
        let dir = std::env::temp_dir().join(format!("xtask-bench-plot-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let json = dir.join("bench.json");
        fs::write(&json, FIXTURE).unwrap();
        let files = plot_file(&json, &dir).unwrap();
        let png = fs::read(&files[0]).unwrap();
        assert!(png.len() > 1000 && png.starts_with(b"\x89PNG\r\n\x1a\n"));
        let svg = fs::read_to_string(&files[1]).unwrap();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("ib_read_lat 1M") && svg.contains("Rust/C time ratio"));
        // A control run's JSON is refused: its axis would be C over C.
        let control = FIXTURE.replace(r#"{"method": {}"#, r#"{"method": {"control": true}"#);
        fs::write(&json, control).unwrap();
        let err = plot_file(&json, &dir).unwrap_err().to_string();
        assert!(err.contains("control run"), "{err}");
        fs::remove_dir_all(&dir).unwrap();
    }
}
