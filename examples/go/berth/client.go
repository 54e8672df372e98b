// Package berth connects to berth's sessions and budget services with grpc-go and the stubs
// generate.sh makes from proto/: it finds the services as the berth command does (ResolveURL,
// ResolveToken), sends the bearer token on every call, and reads the typed details of an error
// (ErrorOf, Detail). Everything else is the generated clients, used as they are.
package berth

import (
	"context"
	"fmt"
	"net"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health/grpc_health_v1"

	budgetv1 "example.com/berth-go/gen/berth/budget/v1"
	locksv1 "example.com/berth-go/gen/berth/locks/v1"
	sessionsv1 "example.com/berth-go/gen/berth/sessions/v1"
)

// Options of Dial. Every field may be left empty: the services are then found from the
// environment (see ResolveURL and ResolveToken).
type Options struct {
	SessionsURL string
	BudgetURL   string
	Token       string
	TokenFile   string
	// Getenv reads the environment (default os.Getenv).
	Getenv Getenv
	// DialOptions are added to berth's own (plaintext, the token, no proxy).
	DialOptions []grpc.DialOption
}

// Client holds a connection to each service and the generated clients over them.
type Client struct {
	// SessionsURL and BudgetURL are where the services were found; Token is the bearer token sent
	// on every call ("" without one).
	SessionsURL, BudgetURL, Token string
	Sessions                      sessionsv1.SessionServiceClient
	Locks                         locksv1.LockServiceClient
	Budget                        budgetv1.BudgetServiceClient
	// SessionsHealth and BudgetHealth are grpc.health.v1 (no token needed).
	SessionsHealth, BudgetHealth grpc_health_v1.HealthClient

	sessions, budget *grpc.ClientConn
}

// Dial resolves both services and connects to them (lazily: a service that is down fails the first
// call, not Dial).
func Dial(options Options) (*Client, error) {
	sessionsURL, err := ResolveURL(Sessions, options.SessionsURL, options.Getenv)
	if err != nil {
		return nil, err
	}
	budgetURL, err := ResolveURL(Budget, options.BudgetURL, options.Getenv)
	if err != nil {
		return nil, err
	}
	token, err := ResolveToken(options.Token, options.TokenFile, options.Getenv)
	if err != nil {
		return nil, err
	}
	sessions, err := dial(sessionsURL, token, options.DialOptions)
	if err != nil {
		return nil, err
	}
	budget, err := dial(budgetURL, token, options.DialOptions)
	if err != nil {
		sessions.Close()
		return nil, err
	}
	return &Client{
		SessionsURL:    sessionsURL,
		BudgetURL:      budgetURL,
		Token:          token,
		Sessions:       sessionsv1.NewSessionServiceClient(sessions),
		Locks:          locksv1.NewLockServiceClient(sessions),
		Budget:         budgetv1.NewBudgetServiceClient(budget),
		SessionsHealth: grpc_health_v1.NewHealthClient(sessions),
		BudgetHealth:   grpc_health_v1.NewHealthClient(budget),
		sessions:       sessions,
		budget:         budget,
	}, nil
}

// Close closes both connections; streams still open end with CANCELED (a Hold frees its lock, an
// Admit releases its reservation).
func (c *Client) Close() error {
	err := c.sessions.Close()
	if berr := c.budget.Close(); err == nil {
		err = berr
	}
	return err
}

// dial connects in plaintext to a resolved URL: http://HOST:PORT or unix:PATH. The dialer is ours,
// for both: grpc-go 1.33 has no unix: target, and a dialer of our own also keeps an HTTP proxy
// variable from rerouting a service on this machine.
func dial(url, token string, extra []grpc.DialOption) (*grpc.ClientConn, error) {
	var network, address string
	switch {
	case strings.HasPrefix(url, "unix:"):
		network, address = "unix", strings.TrimPrefix(url, "unix:")
	case strings.HasPrefix(url, "http://"):
		network, address = "tcp", strings.TrimPrefix(url, "http://")
	default:
		return nil, fmt.Errorf("berth serves plaintext: use http://HOST:PORT or unix:PATH, not %s (put TLS in a proxy and adapt dial to go further)", url)
	}
	options := []grpc.DialOption{
		// grpc.WithInsecure: grpc-go 1.33 predates credentials/insecure. berth serves plaintext on
		// loopback (put TLS in a proxy in front of it to go further).
		grpc.WithInsecure(),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var dialer net.Dialer
			return dialer.DialContext(ctx, network, address)
		}),
	}
	if network == "unix" {
		// The :authority would otherwise be the socket's path, which HTTP/2 servers (Node's among
		// them) refuse with PROTOCOL_ERROR; newer grpc-go sends "localhost" for unix: targets too.
		options = append(options, grpc.WithAuthority("localhost"))
	}
	if token != "" {
		options = append(options, grpc.WithPerRPCCredentials(bearer(token)))
	}
	// The passthrough resolver hands the address to the dialer as it is.
	return grpc.Dial("passthrough:///"+address, append(options, extra...)...)
}

// bearer sends `authorization: Bearer <token>` on every call. Call credentials over plaintext are
// allowed because RequireTransportSecurity says so: berth on a dev box is plaintext on loopback.
type bearer string

func (t bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(t)}, nil
}

func (bearer) RequireTransportSecurity() bool { return false }
