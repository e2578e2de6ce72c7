//! Reading Prometheus text (kube-apiserver's `/metrics`), for the benches that count from it.

/// The samples of `metric` (its exact name, labels required): each one's label text (what is
/// between the braces) and value. Lines that do not parse are skipped.
pub fn samples<'a>(text: &'a str, metric: &str) -> impl Iterator<Item = (&'a str, f64)> + 'a {
    let metric = format!("{metric}{{");
    text.lines().filter_map(move |line| {
        let rest = line.strip_prefix(metric.as_str())?;
        let (labels, value) = rest.rsplit_once(' ')?;
        let labels = labels.strip_suffix('}')?;
        Some((labels, value.parse().ok()?))
    })
}

/// The value of label `key` in a sample's label text, if it has one. Values are read to their
/// closing quote (the metrics read here hold no escaped quotes; commas in values are fine).
pub fn label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    let mut rest = labels;
    while !rest.is_empty() {
        let (k, after) = rest.split_once("=\"")?;
        let end = after.find('"')?;
        if k.trim_start_matches(',') == key {
            return Some(&after[..end]);
        }
        rest = &after[end + 1..];
    }
    None
}
