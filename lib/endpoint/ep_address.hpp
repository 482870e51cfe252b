// Peer addresses of an endpoint: the text a user inserts, resolved once to the numeric
// listener address that is the key of the address vector (and travels in the identity).
#pragma once

#include <string>
#include <string_view>

#include <rdmx/uri.hpp>

#include "endpoint/ep_wire.hpp"

namespace rdmx::ep
{

struct resolved_address {
    net_address key;
    std::string text; ///< canonical: "tcp://10.0.0.1:7471", "rdma://[fe80::1]:7471"
};

/// Parses and resolves `text` for an endpoint of backend `b` (tcp:// or auto:// on TCP,
/// rdma:// or auto:// on verbs). A port of 0 is allowed only with `allow_port0` (the
/// endpoint's own address before listening). `automatic`: the text is auto:// (to_text).
/// Throws rdmx::error(invalid_argument).
resolved_address resolve_address(std::string_view text, backend b, bool allow_port0 = false,
                                 bool automatic = false);
/// The canonical text of a key (for a peer that contacted us first). `automatic` (an
/// endpoint opened with auto://): "auto://10.0.0.1:7471", so that its connections take
/// auto://'s choice (shm for a listener on this host: docs/shm.md).
std::string to_text(const net_address& key, backend b, bool automatic = false);

} // namespace rdmx::ep
