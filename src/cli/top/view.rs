//! `top`'s screen state, its keys and its drawing; no I/O here, so tests
//! render it into ratatui's test backend.

use std::collections::HashMap;
use std::time::Duration;

use ratatui::Frame;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Cell, Paragraph, Row as TableRow, Table, TableState};

use super::model::{Column, Latency, Row, Sample};
use crate::connectors::ConnectorKind;

/// What a key asks the loop to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Quit,
    /// `start`, `stop` or `restart` the connector.
    Lifecycle {
        kind: ConnectorKind,
        key: String,
        verb: &'static str,
    },
}

/// The screen: the latest rows, the selection, sort and filter.
#[derive(Debug)]
pub struct App {
    pub url: String,
    rows: Vec<Row>,
    previous: HashMap<(ConnectorKind, String), Sample>,
    selected: Option<(ConnectorKind, String)>,
    sort: Column,
    descending: bool,
    filter: String,
    /// Typing a filter (after `/`).
    editing: bool,
    /// The last action's outcome or the last fetch error.
    pub message: String,
}

impl App {
    pub fn new(url: String) -> App {
        App {
            url,
            rows: Vec::new(),
            previous: HashMap::new(),
            selected: None,
            sort: Column::Key,
            descending: false,
            filter: String::new(),
            editing: false,
            message: String::new(),
        }
    }

    /// Takes a new sample of every connector, `elapsed` after the last one.
    pub fn update(&mut self, samples: Vec<Sample>, elapsed: Duration) {
        let mut previous = HashMap::with_capacity(samples.len());
        self.rows = samples
            .into_iter()
            .map(|sample| {
                let id = (sample.kind, sample.key.clone());
                let row = Row::new(sample.clone(), self.previous.get(&id), elapsed);
                previous.insert(id, sample);
                row
            })
            .collect();
        self.previous = previous;
        if self.selected.is_none() {
            self.selected = self.visible().first().map(|row| id_of(row));
        }
    }

    /// The rows shown: filtered, then sorted.
    pub fn visible(&self) -> Vec<&Row> {
        let mut rows: Vec<&Row> = self
            .rows
            .iter()
            .filter(|row| self.filter.is_empty() || row.matches(&self.filter))
            .collect();
        rows.sort_by(|left, right| {
            let order = left.compare(right, self.sort);
            let order = if self.descending {
                order.reverse()
            } else {
                order
            };
            order.then_with(|| left.compare(right, Column::Key))
        });
        rows
    }

    pub fn handle_key(&mut self, key: KeyEvent) -> Option<Action> {
        if key.code == KeyCode::Char('c') && key.modifiers.contains(KeyModifiers::CONTROL) {
            return Some(Action::Quit);
        }
        if self.editing {
            match key.code {
                KeyCode::Enter => self.editing = false,
                KeyCode::Esc => {
                    self.editing = false;
                    self.filter.clear();
                }
                KeyCode::Backspace => {
                    self.filter.pop();
                }
                KeyCode::Char(typed) => self.filter.push(typed),
                _ => {}
            }
            return None;
        }
        match key.code {
            KeyCode::Char('q') | KeyCode::Esc => return Some(Action::Quit),
            KeyCode::Down | KeyCode::Char('j') => self.move_selection(1),
            KeyCode::Up | KeyCode::Char('k') => self.move_selection(-1),
            KeyCode::Char('o') => self.sort = self.sort.next(),
            KeyCode::Char('O') => self.descending = !self.descending,
            KeyCode::Char('/') => self.editing = true,
            KeyCode::Char('s') => return self.lifecycle("start"),
            KeyCode::Char('x') => return self.lifecycle("stop"),
            KeyCode::Char('r') => return self.lifecycle("restart"),
            _ => {}
        }
        None
    }

    pub fn draw(&self, frame: &mut Frame) {
        let [header, table, footer] = Layout::vertical([
            Constraint::Length(1),
            Constraint::Min(3),
            Constraint::Length(2),
        ])
        .areas(frame.area());
        frame.render_widget(Paragraph::new(self.header()), header);
        let rows = self.visible();
        let selected = rows
            .iter()
            .position(|row| Some(id_of(row)) == self.selected);
        let mut state = TableState::default().with_selected(selected);
        frame.render_stateful_widget(self.table(&rows), table, &mut state);
        let help = if self.editing {
            format!("filter: {}▏ (Enter keep, Esc clear)", self.filter)
        } else {
            "↑↓ select  s start  x stop  r restart  o sort column  O reverse  / filter  q quit"
                .to_owned()
        };
        frame.render_widget(
            Paragraph::new(vec![
                Line::from(help),
                Line::styled(self.message.clone(), Style::new().fg(Color::Yellow)),
            ]),
            footer,
        );
    }

    fn header(&self) -> Line<'static> {
        let running = self
            .rows
            .iter()
            .filter(|row| row.sample.status == "running")
            .count();
        let order = if self.descending { "↓" } else { "↑" };
        let mut text = format!(
            "iggy-connect top  {}  {} connectors, {running} running  sort: {} {order}",
            self.url,
            self.rows.len(),
            self.sort.title(),
        );
        if !self.filter.is_empty() {
            text.push_str(&format!("  filter: {}", self.filter));
        }
        Line::styled(text, Style::new().add_modifier(Modifier::BOLD))
    }

    fn table(&self, rows: &[&Row]) -> Table<'static> {
        let header = TableRow::new(Column::ALL.map(|column| {
            let style = if column == self.sort {
                Style::new().add_modifier(Modifier::BOLD | Modifier::UNDERLINED)
            } else {
                Style::new().add_modifier(Modifier::BOLD)
            };
            Cell::from(column.title()).style(style)
        }));
        let widths = [
            Constraint::Min(18),
            Constraint::Length(8),
            Constraint::Length(8),
            Constraint::Length(8),
            Constraint::Length(10),
            Constraint::Length(6),
            Constraint::Length(6),
            Constraint::Length(14),
            Constraint::Length(8),
            Constraint::Fill(2),
        ];
        Table::new(rows.iter().map(|row| table_row(row)), widths)
            .header(header)
            .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED))
            .highlight_symbol("▶")
    }

    fn move_selection(&mut self, by: isize) {
        let rows = self.visible();
        if rows.is_empty() {
            return;
        }
        let at = rows
            .iter()
            .position(|row| Some(id_of(row)) == self.selected)
            .map_or(0, |at| at as isize + by);
        let at = at.clamp(0, rows.len() as isize - 1) as usize;
        self.selected = Some(id_of(rows[at]));
    }

    /// The selected connector's action, when it is shown.
    fn lifecycle(&self, verb: &'static str) -> Option<Action> {
        let rows = self.visible();
        let row = rows.iter().find(|row| Some(id_of(row)) == self.selected)?;
        Some(Action::Lifecycle {
            kind: row.sample.kind,
            key: row.sample.key.clone(),
            verb,
        })
    }
}

fn id_of(row: &Row) -> (ConnectorKind, String) {
    (row.sample.kind, row.sample.key.clone())
}

fn table_row(row: &Row) -> TableRow<'static> {
    let sample = &row.sample;
    let status_color = match sample.status.as_str() {
        "running" => Color::Green,
        "error" => Color::Red,
        "stopped" => Color::DarkGray,
        _ => Color::Yellow,
    };
    let kind = match sample.kind {
        ConnectorKind::Source => "source",
        ConnectorKind::Sink => "sink",
    };
    TableRow::new([
        Cell::from(format!("{kind} {}", sample.key)),
        Cell::from(sample.status.clone()).style(Style::new().fg(status_color)),
        Cell::from(rate(row.in_rate)),
        Cell::from(rate(row.out_rate)),
        Cell::from(
            row.bytes_rate
                .map_or("-".to_owned(), |bytes| size(bytes as u64)),
        ),
        Cell::from(sample.errors.to_string()),
        Cell::from(sample.dead_lettered.to_string()),
        Cell::from(lag(sample)),
        Cell::from(row.p99.map_or("-".to_owned(), latency)),
        Cell::from(sample.last_error.clone().unwrap_or_else(|| "-".to_owned())),
    ])
}

/// `1.2k`-style messages per second.
pub fn rate(rate: Option<f64>) -> String {
    match rate {
        None => "-".to_owned(),
        Some(rate) if rate >= 1e6 => format!("{:.1}M", rate / 1e6),
        Some(rate) if rate >= 1e3 => format!("{:.1}k", rate / 1e3),
        Some(rate) if rate >= 10.0 || rate == 0.0 => format!("{rate:.0}"),
        Some(rate) => format!("{rate:.1}"),
    }
}

/// Bytes in binary units.
pub fn size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64;
    let mut unit = "B";
    for next in UNITS {
        if value < 1024.0 {
            break;
        }
        value /= 1024.0;
        unit = next;
    }
    format!("{value:.1} {unit}")
}

fn latency(latency: Latency) -> String {
    match latency {
        Latency::AtMost(micros) => format!("≤{}", micros_text(micros)),
        Latency::Beyond(micros) => format!(">{}", micros_text(micros)),
    }
}

fn micros_text(micros: u64) -> String {
    match micros {
        0..1_000 => format!("{micros}µs"),
        1_000..1_000_000 => format!("{}ms", micros / 1_000),
        _ => format!("{:.1}s", micros as f64 / 1e6),
    }
}

/// `1234 msg 2.0s`: how far behind, and the oldest waiting message's age.
fn lag(sample: &Sample) -> String {
    let Some(lag) = sample.lag else {
        return "-".to_owned();
    };
    let amount = match (lag.messages, lag.bytes) {
        (Some(messages), _) => format!("{messages} msg"),
        (None, Some(bytes)) => size(bytes),
        (None, None) => String::new(),
    };
    let age = lag
        .oldest_age_ms
        .map(|age| micros_text(age.saturating_mul(1_000)));
    match (amount.is_empty(), age) {
        (true, None) => "-".to_owned(),
        (true, Some(age)) => age,
        (false, None) => amount,
        (false, Some(age)) => format!("{amount} {age}"),
    }
}

#[cfg(test)]
mod tests {
    use ratatui::Terminal;
    use ratatui::backend::TestBackend;

    use super::super::model::{Lag, sample};
    use super::*;

    fn screen(app: &App) -> String {
        let mut terminal = Terminal::new(TestBackend::new(140, 8)).expect("test terminal");
        terminal.draw(|frame| app.draw(frame)).expect("draw");
        let buffer = terminal.backend().buffer();
        (0..buffer.area.height)
            .map(|y| {
                (0..buffer.area.width)
                    .map(|x| buffer[(x, y)].symbol())
                    .collect::<String>()
                    .trim_end()
                    .to_owned()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn key(code: KeyCode) -> KeyEvent {
        KeyEvent::new(code, KeyModifiers::NONE)
    }

    fn app_with_two_sinks() -> App {
        let mut app = App::new("http://api".into());
        let mut slow = sample("slow", 0, vec![0, 0, 0]);
        slow.lag = Some(Lag {
            messages: Some(1234),
            bytes: None,
            oldest_age_ms: Some(2_500),
        });
        slow.last_error = Some("connection refused".into());
        slow.status = "error".into();
        slow.errors = 3;
        app.update(
            vec![slow.clone(), sample("fast", 0, vec![0, 0, 0])],
            Duration::ZERO,
        );
        let mut later = slow;
        later.messages_in = 10;
        app.update(
            vec![later, sample("fast", 2_000, vec![0, 100, 0])],
            Duration::from_secs(1),
        );
        app
    }

    #[test]
    fn given_two_samples_when_drawn_should_show_rates_lag_latency_and_last_error() {
        let app = app_with_two_sinks();
        let text = screen(&app);
        let fast = text
            .lines()
            .find(|line| line.contains("sink fast"))
            .expect("fast row");
        let words: Vec<&str> = fast.split_whitespace().collect();
        assert_eq!(
            words,
            [
                "▶sink", "fast", "running", "2.0k", "2.0k", "19.5", "KiB", "0", "0", "-", "≤2µs",
                "-"
            ]
        );
        let slow = text
            .lines()
            .find(|line| line.contains("sink slow"))
            .expect("slow row");
        assert!(slow.contains("1234 msg 2.5s"), "{slow}");
        assert!(slow.contains("connection refused"), "{slow}");
        assert!(text.contains("2 connectors, 1 running"), "{text}");
    }

    #[test]
    fn given_a_sort_and_a_filter_when_keys_are_pressed_should_reorder_and_hide_rows() {
        let mut app = app_with_two_sinks();
        let keys = |app: &App| -> Vec<String> {
            app.visible()
                .iter()
                .map(|row| row.sample.key.clone())
                .collect()
        };
        assert_eq!(keys(&app), ["fast", "slow"]);
        // Key, Status, In/s: sorted by in/s ascending, then reversed.
        for _ in 0..2 {
            app.handle_key(key(KeyCode::Char('o')));
        }
        assert_eq!(keys(&app), ["slow", "fast"]);
        app.handle_key(key(KeyCode::Char('O')));
        assert_eq!(keys(&app), ["fast", "slow"]);
        for typed in ['/', 'e', 'r', 'r'] {
            app.handle_key(key(KeyCode::Char(typed)));
        }
        app.handle_key(key(KeyCode::Enter));
        assert_eq!(keys(&app), ["slow"]);
        assert!(screen(&app).contains("filter: err"));
    }

    #[test]
    fn given_a_selection_when_x_s_r_are_pressed_should_ask_for_its_lifecycle_action() {
        let mut app = app_with_two_sinks();
        assert_eq!(app.handle_key(key(KeyCode::Down)), None);
        let action = |verb| Action::Lifecycle {
            kind: ConnectorKind::Sink,
            key: "slow".into(),
            verb,
        };
        assert_eq!(
            app.handle_key(key(KeyCode::Char('x'))),
            Some(action("stop"))
        );
        assert_eq!(
            app.handle_key(key(KeyCode::Char('s'))),
            Some(action("start"))
        );
        assert_eq!(
            app.handle_key(key(KeyCode::Char('r'))),
            Some(action("restart"))
        );
        assert_eq!(app.handle_key(key(KeyCode::Char('q'))), Some(Action::Quit));
    }

    #[test]
    fn given_sizes_and_rates_when_formatted_should_be_short() {
        assert_eq!(size(512), "512 B");
        assert_eq!(size(1536), "1.5 KiB");
        assert_eq!(size(3 * 1024 * 1024), "3.0 MiB");
        assert_eq!(rate(Some(0.0)), "0");
        assert_eq!(rate(Some(2.5)), "2.5");
        assert_eq!(rate(Some(12_345.0)), "12.3k");
    }
}
