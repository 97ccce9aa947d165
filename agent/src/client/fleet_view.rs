//! Drawing the fleet view (`client::fleet`'s rows): a terminal table for people, a JSON snapshot
//! for scripts and monitoring (`laya-edge fleet --once --json`).

use laya_topics::value::{Map, Value};

use super::fleet::Row;

fn opt_f(v: Option<f64>) -> Value {
    v.map_or(Value::Null, |x| Value::Float((x * 1000.0).round() / 1000.0))
}

/// The snapshot: `{"devices": [{"device", "health", "state", "backend", "backend_state", "model",
/// "questions_per_s", "p95_total_ms", "busy", "restarts", "temperature_c", "last_event",
/// "birth"}, ...]}`, trouble first.
pub fn json(rows: &[Row]) -> Value {
    let devices = rows
        .iter()
        .map(|r| {
            let mut m = Map::new();
            m.insert("device".into(), r.device.as_str().into());
            m.insert("health".into(), r.health.as_str().into());
            m.insert("state".into(), r.state.as_str().into());
            m.insert("backend".into(), r.backend.as_str().into());
            m.insert("backend_state".into(), r.backend_state.as_str().into());
            m.insert("model".into(), r.model.as_str().into());
            m.insert("questions_per_s".into(), opt_f(r.questions_per_s));
            m.insert("p95_total_ms".into(), opt_f(r.p95_total_ms));
            m.insert("busy".into(), opt_f(r.busy));
            m.insert("restarts".into(), Value::Int(r.restarts.into()));
            m.insert("temperature_c".into(), opt_f(r.temperature_c));
            m.insert("last_event".into(), r.last_event.as_deref().map_or(Value::Null, Value::from));
            m.insert("birth".into(), Value::Int(r.birth.into()));
            Value::Object(m)
        })
        .collect();
    let mut m = Map::new();
    m.insert("devices".into(), Value::Array(devices));
    Value::Object(m)
}

const HEADERS: [&str; 10] =
    ["DEVICE", "HEALTH", "BACKEND", "MODEL", "Q/S", "P95 MS", "BUSY", "RESTARTS", "TEMP C", "LAST EVENT"];

/// The table, one line per device under a header line, columns padded to their widest cell;
/// `-` where nothing is known. The last event is cut to `event_width` characters.
pub fn table(rows: &[Row], event_width: usize) -> String {
    let dash = || "-".to_owned();
    let cells: Vec<[String; 10]> = rows
        .iter()
        .map(|r| {
            let backend = if r.backend_state.is_empty() {
                r.backend.clone()
            } else {
                format!("{} {}", r.backend, r.backend_state)
            };
            let event: String = r.last_event.as_deref().unwrap_or("-").chars().take(event_width).collect();
            [
                r.device.clone(),
                r.health.as_str().to_owned(),
                if backend.is_empty() { dash() } else { backend },
                if r.model.is_empty() { dash() } else { r.model.clone() },
                r.questions_per_s.map_or_else(dash, |q| format!("{q:.1}")),
                r.p95_total_ms.map_or_else(dash, |p| format!("{p:.1}")),
                r.busy.map_or_else(dash, |b| format!("{:.0}%", b * 100.0)),
                r.restarts.to_string(),
                r.temperature_c.map_or_else(dash, |t| format!("{t:.1}")),
                event,
            ]
        })
        .collect();
    let mut widths = HEADERS.map(|h| h.chars().count());
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let mut s = String::new();
        for (i, (c, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  "));
            }
        }
        s.trim_end().to_owned() + "\n"
    };
    let mut out = line(&HEADERS.map(String::from));
    for row in &cells {
        out.push_str(&line(row));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::fleet::Health;
    use laya_topics::json as codec;

    fn row(device: &str, health: Health) -> Row {
        Row {
            device: device.into(),
            health,
            state: "online".into(),
            backend: "qnn".into(),
            backend_state: "ready".into(),
            model: "tickets".into(),
            questions_per_s: Some(12.25),
            p95_total_ms: Some(48.0),
            busy: Some(0.5),
            restarts: 2,
            temperature_c: Some(55.5),
            last_event: Some("worker_restart (deadline): the backend missed its deadline".into()),
            birth: 7,
        }
    }

    #[test]
    fn the_table_lines_up_its_columns_and_marks_the_unknown() {
        let mut unknown = row("board-10", Health::Unknown);
        unknown.questions_per_s = None;
        unknown.model = String::new();
        unknown.last_event = None;
        let text = table(&[row("b1", Health::Ok), unknown], 20);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        let col = |l: &str, what: &str| l.find(what).unwrap();
        assert_eq!(col(lines[0], "HEALTH"), col(lines[1], "ok"));
        assert_eq!(col(lines[0], "Q/S"), col(lines[1], "12.2"));
        assert!(lines[1].contains("50%") && lines[1].contains("55.5") && lines[1].contains("qnn ready"), "{text}");
        assert!(lines[1].ends_with("worker_restart (dead"), "cut to 20: {text}");
        assert!(lines[2].contains("unknown") && lines[2].ends_with('-'), "{text}");
    }

    #[test]
    fn the_snapshot_names_every_column() {
        let v = json(&[row("b1", Health::Degraded)]);
        assert_eq!(
            codec::to_string(&v, codec::Style::COMPACT),
            concat!(
                r#"{"devices":[{"device":"b1","health":"degraded","state":"online","backend":"qnn","backend_state":"ready","#,
                r#""model":"tickets","questions_per_s":12.25,"p95_total_ms":48.0,"busy":0.5,"restarts":2,"temperature_c":55.5,"#,
                r#""last_event":"worker_restart (deadline): the backend missed its deadline","birth":7}]}"#
            )
        );
    }
}
