//! `check DATA_DIR`: a stopped broker's data through start-up recovery as a dry run,
//! or with `--repair` for real after a backup of every file it changes.

use std::io;

use mortarmq::broker::registry::REGISTRY_FILE;
use mortarmq::broker::topics::{Registry, RegistryRebuild};
use mortarmq::broker::{DataDirLock, TOPICS_DIR};
use mortarmq::log::{meta, FsStorage};

use crate::inspect::print_json;
use crate::inspect::table;
use crate::{runtime_err, Ctx, Failure, Outcome};

/// `check --repair` keeps an unreadable registry under this name before replacing it.
pub(crate) const DAMAGED_REGISTRY_FILE: &str = "registry.damaged";

/// `check DATA_DIR`: the registry, then every partition directory under
/// `DATA_DIR/topics/*/`, each through start-up recovery as a dry run (with `--repair`,
/// then for real, after backing up every file it changes).
pub(crate) fn cmd_check(ctx: &Ctx) -> Outcome {
    let data_dir = std::path::PathBuf::from(&ctx.matches.free[0]);
    let repair = ctx.matches.opt_present("repair");
    let json = ctx.matches.opt_present("json");
    let topics = data_dir.join(TOPICS_DIR);
    std::fs::metadata(&topics).or_else(|e| runtime_err(format!("{}: {e}", topics.display())))?;
    // A repair writes, so it needs the directory to itself; a plain check only reads,
    // so a live broker is worth a warning, not a refusal.
    let _lock = if repair {
        Some(DataDirLock::acquire(&data_dir).map_err(Failure::Runtime)?)
    } else {
        if let Some(held) = DataDirLock::holder(&data_dir) {
            eprintln!("mortarctl: warning: {held}; what it is writing may show as torn");
        }
        None
    };
    let mut problems = check_registry(&data_dir, repair, json)?;
    let names = partition_names(&data_dir);
    let mut backups = CheckBackups::new(&data_dir, json);
    let mut rows = Vec::new();
    let mut docs = Vec::new();
    for (dir, name) in &names {
        let backup: Option<mortarmq::log::Backup<'_>> = match repair {
            true => Some(&mut |path| backups.save(path)),
            false => None,
        };
        let report = mortarmq::log::check_partition(&FsStorage, dir, backup)
            .or_else(|e| runtime_err(format!("{name}: {e}")))?;
        problems += report.problems.len();
        print_check_lines(name, &report, (repair, json));
        rows.push(check_row(name, &report));
        docs.push(check_json(name, &report));
    }
    if json {
        print_json(&serde_json::Value::Array(docs));
    } else {
        let header = ["PARTITION", "SEGMENTS", "RECORDS", "SEQUENCES", "RESULT"];
        print!("{}", table(&header, &rows));
    }
    if problems > 0 && !repair {
        return runtime_err(format!(
            "{problems} problems found, nothing changed; --repair makes the changes listed \
             (after backing up each file) and rebuilds a missing or unreadable registry"
        ));
    }
    Ok(())
}

/// Every partition directory under `DATA_DIR/topics/`, sorted, with the name an operator
/// knows it by: `topic NAME partition P (dir ID-CRC/P)`. Names come from the registry,
/// or when it is unreadable from the topic directories as a rebuild would register them.
pub(crate) fn partition_names(data_dir: &std::path::Path) -> Vec<(std::path::PathBuf, String)> {
    let topics = data_dir.join(TOPICS_DIR);
    let registry = match meta::read_checked(&FsStorage, &data_dir.join(REGISTRY_FILE)) {
        Ok(Some(bytes)) => Registry::decode(&bytes).ok(),
        _ => None,
    }
    .or_else(|| {
        RegistryRebuild::scan(&FsStorage, &topics)
            .ok()
            .map(|r| r.registry)
    });
    let mut known = std::collections::HashMap::new();
    for pair in registry.iter().flat_map(|r| r.pairs()) {
        for (id, name) in pair.topics() {
            known.insert(
                mortarmq::broker::topics::topic_dir(&topics, id, &name),
                name,
            );
        }
    }
    let mut dirs = Vec::new();
    for topic in std::fs::read_dir(&topics).into_iter().flatten().flatten() {
        let Ok(parts) = std::fs::read_dir(topic.path()) else {
            continue;
        };
        for part in parts.flatten().map(|p| p.path()).filter(|p| p.is_dir()) {
            let rel = part
                .strip_prefix(&topics)
                .unwrap_or(&part)
                .display()
                .to_string();
            let index = part
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .to_string();
            let name = match known.get(&topic.path()) {
                Some(t) => format!("topic {t} partition {index} (dir {rel})"),
                None => format!("unregistered dir {rel}"),
            };
            dirs.push((part, name));
        }
    }
    dirs.sort();
    dirs
}

/// Backups taken by `check --repair`: every file is copied, before its first change,
/// to the same path under `DATA_DIR/check-backup-UNIXTIME/`, and each copy is named on
/// a line of its own (standard error under `--json`).
pub(crate) struct CheckBackups {
    data_dir: std::path::PathBuf,
    dir: std::path::PathBuf,
    json: bool,
}

impl CheckBackups {
    fn new(data_dir: &std::path::Path, json: bool) -> CheckBackups {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        CheckBackups {
            data_dir: data_dir.to_path_buf(),
            dir: data_dir.join(format!("check-backup-{now}")),
            json,
        }
    }

    fn save(&mut self, path: &std::path::Path) -> io::Result<()> {
        let rel = path.strip_prefix(&self.data_dir).unwrap_or(path);
        let to = self.dir.join(rel);
        // The copy must be on disk, and findable, before the original changes.
        mortarmq::log::storage::copy_durable(&FsStorage, path, &to)?;
        let line = format!("backed up {} to {}", path.display(), to.display());
        match self.json {
            true => eprintln!("{line}"),
            false => println!("{line}"),
        }
        Ok(())
    }
}

/// One line per change and per damaged record: what a repair would do, or did.
pub(crate) fn print_check_lines(
    name: &str,
    report: &mortarmq::log::CheckReport,
    (done, json): (bool, bool),
) {
    use mortarmq::log::ChangeKind;
    let (would, keep) = match done {
        true => ("", "kept"),
        false => ("would ", "would keep"),
    };
    let mut lines = Vec::new();
    for d in &report.plan.damaged {
        lines.push(format!(
            "{name}: {keep} damaged record at seq {} ({} byte {}: {}); consumers skip it",
            d.sequence,
            d.path.display(),
            d.position,
            d.reason
        ));
    }
    for c in &report.plan.changes {
        let file = c.path.display();
        lines.push(match (c.what, done) {
            (ChangeKind::Truncate { to, bytes }, false) => {
                format!("{name}: would truncate {bytes} bytes of {file} (at byte {to})")
            }
            (ChangeKind::Truncate { to, bytes }, true) => {
                format!("{name}: truncated {bytes} bytes of {file} (at byte {to})")
            }
            (ChangeKind::Reset { bytes }, _) => {
                format!("{name}: {would}reset {file} (bad header; {bytes} bytes)")
            }
            (ChangeKind::Remove { bytes }, false) => {
                format!("{name}: would remove {file} ({bytes} bytes)")
            }
            (ChangeKind::Remove { bytes }, true) => {
                format!("{name}: removed {file} ({bytes} bytes)")
            }
            (ChangeKind::RewriteIndex, _) => format!("{name}: {would}rewrite index {file}"),
        });
    }
    for line in lines {
        match json {
            true => eprintln!("{line}"),
            false => println!("{line}"),
        }
    }
}

pub(crate) fn check_row(name: &str, r: &mortarmq::log::CheckReport) -> Vec<String> {
    let damaged = r.plan.damaged.len();
    let lost = r.plan.truncated_bytes;
    let verdict = match (&r.repaired, r.plan.changes.is_empty()) {
        (_, true) if damaged == 0 => "ok".to_string(),
        (_, true) => format!("{damaged} damaged records kept"),
        (Some(done), false) => format!(
            "repaired: {} bytes truncated, {damaged} damaged records kept",
            done.truncated_bytes
        ),
        (None, false) => format!(
            "{} changes to make ({lost} bytes to truncate), {damaged} damaged records",
            r.plan.changes.len()
        ),
    };
    vec![
        name.to_string(),
        r.segments.to_string(),
        r.records.to_string(),
        format!("{}..{}", r.first_sequence, r.next_sequence),
        verdict,
    ]
}

pub(crate) fn check_json(name: &str, r: &mortarmq::log::CheckReport) -> serde_json::Value {
    serde_json::json!({
        "partition": name,
        "segments": r.segments,
        "records": r.records,
        "first_sequence": r.first_sequence,
        "next_sequence": r.next_sequence,
        "problems": r.problems.iter().map(|p| serde_json::json!({
            "path": p.path.display().to_string(),
            "position": p.position,
            "reason": p.reason,
        })).collect::<Vec<_>>(),
        "damaged_records": r.plan.damaged.iter().map(|d| serde_json::json!({
            "path": d.path.display().to_string(),
            "position": d.position,
            "sequence": d.sequence,
            "reason": d.reason,
        })).collect::<Vec<_>>(),
        "truncate_bytes": r.plan.truncated_bytes,
        "repaired": r.repaired.as_ref().map(|x| x.truncated_bytes),
    })
}

/// The registry of `data_dir`: readable, or rebuilt from the topic directories (with
/// `--repair`; without it the rebuild is only shown). Returns the problems left. Its
/// lines go to standard error when standard output carries JSON.
pub(crate) fn check_registry(
    data_dir: &std::path::Path,
    repair: bool,
    json: bool,
) -> Result<usize, Failure> {
    let say = |line: String| match json {
        true => eprintln!("registry: {line}"),
        false => println!("registry: {line}"),
    };
    let path = data_dir.join(REGISTRY_FILE);
    let damage = match meta::read_checked(&FsStorage, &path) {
        Ok(Some(bytes)) => match Registry::decode(&bytes) {
            Ok(_) => return Ok(0),
            Err(e) => Some(e),
        },
        Ok(None) => None,
        // A damaged file's message starts with its path, which the line names anyway.
        Err(e) => Some(e.to_string().replace(&format!("{}: ", path.display()), "")),
    };
    let rebuild = RegistryRebuild::scan(&FsStorage, &data_dir.join(TOPICS_DIR))
        .or_else(|e| runtime_err(format!("cannot rebuild the registry: {e}")))?;
    if damage.is_none() && rebuild.pairs.is_empty() && rebuild.ignored.is_empty() {
        // A data directory no broker has used yet.
        return Ok(0);
    }
    say(match &damage {
        Some(why) => format!("{} is unreadable: {why}", path.display()),
        None => format!("{} is missing", path.display()),
    });
    for p in &rebuild.pairs {
        let t = &p.pair;
        say(format!(
            "{} '{}' (ids {} and {}, {} partitions){}",
            if repair {
                "registered"
            } else {
                "would register"
            },
            t.name,
            t.source_id(),
            t.twin_id(),
            t.partition_count,
            match p.placeholder {
                true => " under a placeholder name: no topic file names it",
                false => "",
            }
        ));
        for note in &p.notes {
            say(format!("  {note}"));
        }
    }
    for entry in &rebuild.ignored {
        say(format!(
            "left out {entry} (mortard deletes what the registry does not name)"
        ));
    }
    if !repair {
        return Ok(1);
    }
    if damage.is_some() {
        let kept = data_dir.join(DAMAGED_REGISTRY_FILE);
        mortarmq::log::storage::copy_durable(&FsStorage, &path, &kept)
            .or_else(|e| runtime_err(format!("cannot keep {}: {e}", kept.display())))?;
        say(format!(
            "kept the unreadable registry as {}",
            kept.display()
        ));
    }
    rebuild
        .apply(&FsStorage, &path)
        .or_else(|e| runtime_err(format!("cannot rebuild the registry: {e}")))?;
    say(format!(
        "rebuilt {} with {} topic pairs",
        path.display(),
        rebuild.pairs.len()
    ));
    Ok(0)
}
