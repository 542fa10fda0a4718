//! Connections counted per peer address, so that one address cannot take every place a
//! listener has: `oar serve`'s and the metrics ports' connections, and a parameter server's
//! connections that have not yet completed their handshake. Each connection holds a [`Held`]
//! place, given back when dropped; an address without connections keeps no entry, so the table
//! is as large as the connections open, not as the addresses ever seen.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use parking_lot::Mutex;

/// How many connections each address holds, at most `most` each.
pub struct PerAddress {
    open: Mutex<HashMap<IpAddr, usize>>,
    most: usize,
}

/// One connection counted against its address until dropped.
pub struct Held {
    table: Arc<PerAddress>,
    ip: IpAddr,
}

impl PerAddress {
    /// A table allowing `most` connections an address (at least 1).
    pub fn new(most: usize) -> Arc<PerAddress> {
        Arc::new(PerAddress { open: Mutex::new(HashMap::new()), most: most.max(1) })
    }

    /// The most connections one address may hold.
    pub fn most(&self) -> usize {
        self.most
    }

    /// Counts a connection from `ip`, unless it holds its share already.
    pub fn hold(self: &Arc<Self>, ip: IpAddr) -> Option<Held> {
        let mut open = self.open.lock();
        let n = open.entry(ip).or_insert(0);
        if *n >= self.most {
            return None;
        }
        *n += 1;
        Some(Held { table: self.clone(), ip })
    }

    /// Connections `ip` holds now.
    #[cfg(test)]
    fn held(&self, ip: IpAddr) -> usize {
        self.open.lock().get(&ip).copied().unwrap_or(0)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut open = self.table.open.lock();
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            // An address without connections takes no memory: the table is as large as the
            // connections open, not as the addresses ever seen.
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_holds_its_share_and_no_more_and_others_are_apart() {
        let (a, b): (IpAddr, IpAddr) = ("127.0.0.1".parse().unwrap(), "127.0.0.2".parse().unwrap());
        let table = PerAddress::new(2);
        let first = table.hold(a).unwrap();
        let second = table.hold(a).unwrap();
        assert!(table.hold(a).is_none(), "a third from the same address");
        let other = table.hold(b).expect("another address has its own share");
        drop(first);
        let again = table.hold(a).expect("a place given back is taken again");
        assert_eq!((table.held(a), table.held(b)), (2, 1));
        drop((second, again, other));
        assert!(table.open.lock().is_empty(), "no entry stays for an address without connections");
        assert_eq!(PerAddress::new(0).most(), 1);
    }
}
