package enrolment

import "github.com/ferry-dev/ferry/broker/kcp"

// Clients reach the Secrets of the export workspaces with the broker's kcp
// credentials (kcp.NewSecretsClients).
type Clients = kcp.SecretsClients

// ClientsFunc adapts a function to Clients (tests).
type ClientsFunc = kcp.SecretsClientsFunc
