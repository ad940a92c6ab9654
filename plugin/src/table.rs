//! Tables the way kubectl prints them: upper-case headers, columns left-aligned and
//! separated by three spaces, `<none>` for a missing value, no trailing blanks.
//!
//! Pure: rows in, text out. [`Output`] is the `-o` flag every listing command takes.

use std::fmt::Write as _;

/// What `-o` asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// The default table.
    #[default]
    #[value(hide = true)]
    Table,
    /// The table with more columns.
    Wide,
    /// The API's JSON, unchanged.
    Json,
    /// The same as YAML.
    Yaml,
}

impl Output {
    pub fn wide(self) -> bool {
        self == Self::Wide
    }

    /// Prints `value` as JSON or YAML when asked for; `false` when a table is wanted.
    pub fn print_document(self, value: &serde_json::Value) -> Result<bool, serde_norway::Error> {
        match self {
            Self::Json => {
                println!(
                    "{}",
                    serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
                );
                Ok(true)
            }
            Self::Yaml => {
                print!("{}", serde_norway::to_string(value)?);
                Ok(true)
            }
            Self::Table | Self::Wide => Ok(false),
        }
    }
}

/// Shown for a missing value, as kubectl does.
pub const NONE: &str = "<none>";

/// Columns separate by this much, as kubectl's tabwriter does.
const GAP: usize = 3;

/// A table being built.
#[derive(Debug, Clone)]
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new<I, S>(headers: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            headers: headers
                .into_iter()
                .map(|h| h.into().to_uppercase())
                .collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; empty cells print as [`NONE`], missing trailing cells likewise.
    pub fn row<I, S>(&mut self, cells: I)
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut row: Vec<String> = cells
            .into_iter()
            .map(Into::into)
            .map(|c| if c.is_empty() { NONE.to_owned() } else { c })
            .collect();
        row.resize(self.headers.len().max(row.len()), NONE.to_owned());
        self.rows.push(row);
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The column widths: the widest cell of each column, header included.
    pub fn widths(&self) -> Vec<usize> {
        let columns = self
            .rows
            .iter()
            .map(Vec::len)
            .chain([self.headers.len()])
            .max()
            .unwrap_or(0);
        (0..columns)
            .map(|i| {
                std::iter::once(&self.headers)
                    .chain(&self.rows)
                    .filter_map(|row| row.get(i))
                    .map(|cell| cell.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect()
    }

    /// The whole table, one line per row, each ending in a newline.
    pub fn render(&self) -> String {
        let widths = self.widths();
        let mut out = String::new();
        for row in std::iter::once(&self.headers).chain(&self.rows) {
            out.push_str(&line(row, &widths));
            out.push('\n');
        }
        out
    }
}

/// One row padded to `widths`, without trailing blanks: also the way a following command
/// (`tail`, `replay`) prints a row at a time under a header printed once.
pub fn line(cells: &[String], widths: &[usize]) -> String {
    let mut out = String::new();
    for (i, cell) in cells.iter().enumerate() {
        if i + 1 == cells.len() {
            out.push_str(cell);
        } else {
            let width = widths.get(i).copied().unwrap_or(0);
            let pad = width.saturating_sub(cell.chars().count()) + GAP;
            let _ = write!(out, "{cell}{:pad$}", "");
        }
    }
    out.truncate(out.trim_end().len());
    out
}

/// Shortens `text` to at most `max` characters (`…` marks the cut) and flattens
/// newlines, for a response snippet in a table cell.
pub fn snippet(text: &str, max: usize) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if flat.chars().count() <= max {
        return flat;
    }
    let mut cut: String = flat.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligns_columns_like_kubectl() {
        let mut t = Table::new(["name", "state", "backlog"]);
        t.row(["orders", "active", "0"]);
        t.row(["invoices-eu", "degraded", "1200"]);
        assert_eq!(
            t.render(),
            "NAME          STATE      BACKLOG\n\
             orders        active     0\n\
             invoices-eu   degraded   1200\n"
        );
    }

    #[test]
    fn missing_cells_print_none_and_lines_have_no_trailing_blanks() {
        let mut t = Table::new(["a", "b", "c"]);
        t.row(["x", ""]);
        t.row(["longer", "y", ""]);
        let text = t.render();
        assert_eq!(
            text,
            "A        B        C\n\
             x        <none>   <none>\n\
             longer   y        <none>\n"
        );
        assert!(text.lines().all(|l| l == l.trim_end()));
    }

    #[test]
    fn widths_count_characters_not_bytes() {
        let mut t = Table::new(["k", "v"]);
        t.row(["ü…", "1"]);
        assert_eq!(t.widths(), vec![2, 1]);
    }

    #[test]
    fn an_empty_table_is_its_header() {
        let t = Table::new(["event id", "type"]);
        assert!(t.is_empty());
        assert_eq!(t.render(), "EVENT ID   TYPE\n");
    }

    #[test]
    fn snippets_are_cut_and_flattened() {
        assert_eq!(snippet("ok", 10), "ok");
        assert_eq!(snippet("line1\nline2", 20), "line1 line2");
        assert_eq!(snippet("abcdefghij", 5), "abcd…");
        assert_eq!(snippet("", 5), "");
    }
}
