//! Who listens on a TCP port: the socket inodes in `LISTEN` state (`0A`) on that local port in
//! `/proc/net/tcp` and `/proc/net/tcp6` (this network namespace's tables), then the processes whose
//! `/proc/PID/fd/*` link to `socket:[INODE]`.

use std::collections::BTreeSet;
use std::io;
use std::path::Path;

/// The `st` column of a listening socket.
const LISTEN: &str = "0A";

/// Inodes of the sockets listening on `port` in one `/proc/net/tcp{,6}` table's text.
pub fn listening_inodes(table: &str, port: u16) -> BTreeSet<u64> {
    let mut inodes = BTreeSet::new();
    for line in table.lines().skip(1) {
        let columns: Vec<&str> = line.split_whitespace().collect();
        let (Some(local), Some(state), Some(inode)) = (columns.get(1), columns.get(3), columns.get(9)) else { continue };
        let local_port = local.rsplit_once(':').and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
        if local_port == Some(port) && *state == LISTEN {
            if let Ok(inode) = inode.parse::<u64>() {
                if inode != 0 {
                    inodes.insert(inode);
                }
            }
        }
    }
    inodes
}

/// What a scan of every process's descriptors found.
#[derive(Debug, Default)]
pub struct Owners {
    /// Processes holding one of the sockets.
    pub pids: BTreeSet<u32>,
    /// Some process's descriptors could not be listed (another user's, without the right to).
    pub hidden: bool,
}

/// The processes under `proc_root` (normally `/proc`) holding a descriptor to one of `inodes`.
pub fn socket_owners(proc_root: &Path, inodes: &BTreeSet<u64>) -> io::Result<Owners> {
    let mut owners = Owners::default();
    for entry in std::fs::read_dir(proc_root)? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let fds = match std::fs::read_dir(entry.path().join("fd")) {
            Ok(fds) => fds,
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                owners.hidden = true;
                continue;
            }
            Err(_) => continue, // exited meanwhile
        };
        for fd in fds.flatten() {
            let Ok(target) = std::fs::read_link(fd.path()) else { continue };
            let inode = target.to_str().and_then(|t| t.strip_prefix("socket:[")).and_then(|t| t.strip_suffix(']'));
            if inode.and_then(|i| i.parse::<u64>().ok()).is_some_and(|i| inodes.contains(&i)) {
                owners.pids.insert(pid);
                break;
            }
        }
    }
    Ok(owners)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_rows_on_the_port_only() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 100 0 0 10 0
   1: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 4343 1 0000000000000000 20 4 30 10 -1
   2: 00000000:1F91 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4444 1 0000000000000000 100 0 0 10 0
";
        assert_eq!(listening_inodes(table, 8080), BTreeSet::from([4242]));
        assert_eq!(listening_inodes(table, 8081), BTreeSet::from([4444]));
        assert!(listening_inodes(table, 80).is_empty());
        let tcp6 = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 77 1 0000000000000000 100 0 0 10 0
";
        assert_eq!(listening_inodes(tcp6, 8080), BTreeSet::from([77]));
    }
}
