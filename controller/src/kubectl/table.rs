//! Tables laid out the way kubectl lays them out: a header in capitals, columns
//! padded with spaces to the widest cell plus three, at least six wide, and the last
//! column left as it is.
//!
//! Cells are escaped ([`escape`]): they hold names and keys from API objects, and a
//! newline or an escape sequence in one would forge a row or garble the terminal.

use crate::kubectl::terminal::escape;

/// Space after the widest cell of a column.
const PADDING: usize = 3;
/// The narrowest a column gets, padding included.
const MIN_WIDTH: usize = 6;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub(crate) fn new<S: Into<String>>(header: impl IntoIterator<Item = S>) -> Self {
        Self {
            header: header.into_iter().map(Into::into).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; a short row is filled with empty cells.
    pub(crate) fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) {
        let mut cells: Vec<String> = cells
            .into_iter()
            .map(|c| {
                let c: String = c.into();
                escape(&c).into_owned()
            })
            .collect();
        cells.resize(self.header.len().max(cells.len()), String::new());
        self.rows.push(cells);
    }

    /// The table as text, one line per row, each ending in a newline, none ending in
    /// spaces.
    pub(crate) fn render(&self) -> String {
        let lines: Vec<&Vec<String>> = std::iter::once(&self.header).chain(&self.rows).collect();
        let columns = lines.iter().map(|l| l.len()).max().unwrap_or(0);
        let widths: Vec<usize> = (0..columns)
            .map(|i| {
                let widest = lines
                    .iter()
                    .filter_map(|l| l.get(i))
                    .map(|c| c.chars().count())
                    .max()
                    .unwrap_or(0);
                widest.saturating_add(PADDING).max(MIN_WIDTH)
            })
            .collect();
        let mut out = String::new();
        for line in lines {
            let mut text = String::new();
            for (i, cell) in line.iter().enumerate() {
                text.push_str(cell);
                if i.saturating_add(1) < line.len() {
                    let pad = widths[i].saturating_sub(cell.chars().count());
                    text.extend(std::iter::repeat_n(' ', pad));
                }
            }
            out.push_str(text.trim_end());
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_padded_like_kubectl() {
        let mut t = Table::new(["NAME", "N", "LAST COLUMN"]);
        t.row(["a-long-name", "1", "x"]);
        t.row(["b", "12345", ""]);
        t.row(["c"]);
        assert_eq!(
            t.render(),
            "NAME          N       LAST COLUMN\n\
             a-long-name   1       x\n\
             b             12345\n\
             c\n"
        );
    }

    #[test]
    fn a_cell_cannot_forge_a_row_or_reach_the_terminal() {
        let mut t = Table::new(["NODE", "FREE"]);
        t.row(["a\nTOTAL   99", "1"]);
        t.row(["\u{1b}[2J\u{1b}[31mb", "2"]);
        assert_eq!(
            t.render(),
            "NODE                   FREE\n\
             a\\nTOTAL   99          1\n\
             \\u{1b}[2J\\u{1b}[31mb   2\n"
        );
    }
}
