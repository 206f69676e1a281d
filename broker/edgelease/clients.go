package edgelease

import "github.com/ferry-dev/ferry/broker/kcp"

// Clients reach the Leases of the export workspaces with the broker's kcp
// credentials (kcp.NewLeasesClients).
type Clients = kcp.LeasesClients

// ClientsFunc adapts a function to Clients (tests).
type ClientsFunc = kcp.LeasesClientsFunc
