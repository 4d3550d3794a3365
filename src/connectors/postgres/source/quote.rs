//! Quoting PostgreSQL identifiers.

/// `"name"`, with embedded quotes doubled.
pub fn quote_identifier(name: &str) -> Result<String, String> {
    if name.is_empty() {
        return Err("expected a non-empty identifier".into());
    }
    if name.contains('\0') {
        return Err(format!("identifier {name:?} contains a NUL byte"));
    }
    Ok(format!("\"{}\"", name.replace('"', "\"\"")))
}

/// `schema.table` or `table`, each part quoted (so names are case-sensitive, as
/// upstream's source treats them).
pub fn quote_qualified(name: &str) -> Result<String, String> {
    let parts: Vec<&str> = name.split('.').collect();
    if parts.len() > 2 {
        return Err(format!(
            "expected \"table\" or \"schema.table\", found \"{name}\""
        ));
    }
    let quoted = parts
        .iter()
        .map(|part| quote_identifier(part))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(quoted.join("."))
}
